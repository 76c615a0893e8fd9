//! Device buffers: raw allocations, weight matrices in their device layout, f32 vectors,
//! activations with their q8 and bf16 shadows, and the KV cache (f16 or q8_0, laid out as
//! `crate::kv_layout` says) with the decode attention's split partials.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, result};

use super::launch::{self, Ptr};
use super::{GEMM_MIN_TOKENS, Gpu, MAX_GEMV_ROWS, call};
use crate::error::CudaError;
use crate::kv_layout::{KvElem, kv_head_bytes};
use crate::layout::{self, Format, Packed};

/// Fewest positions per decode attention split (the partials are sized for it).
pub(super) const ATT_CHUNK_MIN: usize = 32;
/// Largest GQA group the attention kernels handle (the kernels' `MAX_GROUP`).
pub(super) const MAX_GROUP: usize = 8;

/// `v` as a kernel `int`, or a shape error naming `what`.
pub(super) fn i32_dim(what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v)
        .map_err(|_| CudaError::Shape(format!("{what} = {v} does not fit a kernel int")))
}

/// A device allocation (bytes), freed on drop.
pub struct DevBuf {
    _slice: Option<CudaSlice<u8>>,
    pub(super) ptr: Ptr,
    pub(super) len: usize,
}

impl DevBuf {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A weight matrix `[rows, cols]` resident on the device in its [`Format`].
pub struct DevMatrix {
    /// Layout.
    pub format: Format,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    pub(super) buf: DevBuf,
    pub(super) off1: u64,
    pub(super) off2: u64,
    /// `[rows, cols]` bf16 copy for the prompt GEMM, made on first use.
    pub(super) bf16: Mutex<Option<DevBuf>>,
    /// Multiplies two-level q8 activations in the GEMV (the Q/K/V projections; see
    /// [`Gpu::set_two_level_qkv`]).
    pub two_level: bool,
}

impl DevMatrix {
    /// Device bytes held (the quantized copy, plus the bf16 one once made).
    pub fn device_bytes(&self) -> usize {
        let bf = self
            .bf16
            .lock()
            .map(|b| b.as_ref().map_or(0, DevBuf::len))
            .unwrap_or(0);
        self.buf.len + bf
    }
}

/// A `[n]` f32 vector on the device.
pub struct DevVec {
    /// Elements.
    pub n: usize,
    pub(super) buf: DevBuf,
}

/// An activation `[n_tokens, width]` f32 on the device, with its q8 shadow (`q` int8
/// `[n_tokens, width]`, `ds` float2 `[n_tokens, width / 32]`) and, for prompts, a bf16 copy
/// for the GEMM.
pub struct DevAct {
    /// Tokens (rows).
    pub n: usize,
    /// Rows its buffers hold ([`Gpu::set_rows`] moves `n` within it).
    pub(super) cap: usize,
    /// Width (columns).
    pub width: usize,
    pub(super) x: DevBuf,
    pub(super) q: Option<(DevBuf, DevBuf)>,
    /// The second level of the q8 shadow (`[rows, width]` int8, `[rows, width / 32]` float2,
    /// `rows = min(cap, MAX_GEMV_ROWS)`: `x - d·q` quantized again), for GEMV-sized passes;
    /// written by each two-level matmul before it reads it.
    pub(super) q2: Option<(DevBuf, DevBuf)>,
    pub(super) bf: Option<DevBuf>,
    /// The q8 shadow holds the current contents (its producer wrote both).
    pub(super) q_fresh: AtomicBool,
}

/// The KV cache of every layer (head-major: `[layer][n_kv]` head regions of `n_ctx` rows of
/// `head_dim` values, f16 or q8_0, see `crate::kv_layout`) and the decode attention's split
/// partials.
pub struct DevKv {
    /// Layers.
    pub n_layer: usize,
    /// Positions.
    pub n_ctx: usize,
    /// KV heads.
    pub n_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Query heads (sizes the partials).
    pub n_head: usize,
    /// Element type of the stored keys and values.
    pub elem: KvElem,
    pub(super) k: DevBuf, // [n_layer][n_kv] regions of kv_head_bytes(elem, n_ctx, head_dim)
    // v likewise.
    pub(super) v: DevBuf,
    /// Splits the partials have room for (`n_ctx / ATT_CHUNK_MIN`, rounded up).
    pub(super) max_split: usize,
    pub(super) part_o: DevBuf,  // [n_head][max_split][head_dim] f32
    pub(super) part_ml: DevBuf, // [n_head][max_split] float2
    /// The partials of a batched pass's decode rows (`paged`), grown on demand:
    /// `[n_dec][n_head][n_split][head_dim]` f32 and `[n_dec][n_head][n_split]` float2.
    pub(super) paged_part: Option<(DevBuf, DevBuf)>,
}

impl DevKv {
    /// Bytes of one layer of keys (or values).
    pub fn layer_bytes(&self) -> usize {
        self.n_kv * kv_head_bytes(self.elem, self.n_ctx, self.head_dim)
    }
}

impl Gpu {
    pub(super) fn alloc_on(stream: &Arc<CudaStream>, bytes: usize) -> Result<DevBuf, CudaError> {
        if bytes == 0 {
            return Ok(DevBuf {
                _slice: None,
                ptr: Ptr::NULL,
                len: 0,
            });
        }
        let slice = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(call(format!("allocating {bytes} bytes").as_str()))?;
        let ptr = {
            let (p, _sync) = slice.device_ptr(stream);
            p
        };
        Ok(DevBuf {
            _slice: Some(slice),
            ptr: Ptr(ptr),
            len: bytes,
        })
    }

    /// A zeroed device buffer of `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        Self::alloc_on(&self.stream, bytes)
    }

    /// Copies host bytes into a new device buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<DevBuf, CudaError> {
        let buf = self.alloc(bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `buf` holds `bytes.len()` bytes; the copy is synchronous with respect to
            // the host buffer (pageable memory is staged before the call returns).
            unsafe { result::memcpy_htod_async(buf.ptr.0, bytes, self.stream.cu_stream()) }
                .map_err(call("uploading"))?;
        }
        Ok(buf)
    }

    /// Uploads a matrix (`dtype` rows of `cols`, GGUF bytes) in its device layout.
    pub fn upload_matrix(
        &self,
        dtype: damascus_gguf::GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DevMatrix, CudaError> {
        let p = layout::pack(dtype, bytes, rows, cols)?;
        self.upload_packed(&p)
    }

    /// Uploads an already packed matrix.
    pub fn upload_packed(&self, p: &Packed) -> Result<DevMatrix, CudaError> {
        i32_dim("rows", p.rows)?;
        i32_dim("cols", p.cols)?;
        Ok(DevMatrix {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            buf: self.upload(&p.bytes)?,
            off1: p.off1 as u64,
            off2: p.off2 as u64,
            bf16: Mutex::new(None),
            two_level: false,
        })
    }

    /// Uploads an f32 vector.
    pub fn upload_f32(&self, v: &[f32]) -> Result<DevVec, CudaError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(DevVec {
            n: v.len(),
            buf: self.upload(&bytes)?,
        })
    }

    /// A new activation `[n, width]`. Its buffers serve any row count up to `n` later
    /// ([`Gpu::set_rows`]): the bf16 copy (prompt GEMM) from [`GEMM_MIN_TOKENS`] rows, the
    /// second q8 level for the GEMV-sized row counts.
    pub fn act(&self, n: usize, width: usize) -> Result<DevAct, CudaError> {
        i32_dim("activation elements", n * width)?;
        let q = if width.is_multiple_of(32) {
            Some((self.alloc(n * width)?, self.alloc(n * width / 32 * 8)?))
        } else {
            None
        };
        let q2 = match q {
            Some(_) => {
                let r = n.min(MAX_GEMV_ROWS);
                Some((self.alloc(r * width)?, self.alloc(r * width / 32 * 8)?))
            }
            None => None,
        };
        let bf = if n >= GEMM_MIN_TOKENS {
            Some(self.alloc(n * width * 2)?)
        } else {
            None
        };
        Ok(DevAct {
            n,
            cap: n,
            width,
            x: self.alloc(n * width * 4)?,
            q,
            q2,
            bf,
            q_fresh: AtomicBool::new(false),
        })
    }

    /// Makes `x` an activation of `n` rows in place (contents unspecified), keeping its
    /// buffers and so their addresses (a captured graph that names them replays); false when
    /// its buffers hold fewer than `n` rows.
    pub fn set_rows(&self, x: &mut DevAct, n: usize) -> bool {
        if n > x.cap {
            return false;
        }
        x.n = n;
        x.q_fresh.store(false, Ordering::Relaxed);
        true
    }

    /// A new f16 KV cache.
    pub fn kv(
        &self,
        n_layer: usize,
        n_ctx: usize,
        n_kv: usize,
        head_dim: usize,
        n_head: usize,
    ) -> Result<DevKv, CudaError> {
        self.kv_of(KvElem::F16, n_layer, n_ctx, n_kv, head_dim, n_head)
    }

    /// A new KV cache of `elem` (q8_0 needs a head size that is a multiple of 32).
    pub fn kv_of(
        &self,
        elem: KvElem,
        n_layer: usize,
        n_ctx: usize,
        n_kv: usize,
        head_dim: usize,
        n_head: usize,
    ) -> Result<DevKv, CudaError> {
        elem.check(head_dim)?;
        if launch::head_variant(head_dim).is_none() {
            return Err(CudaError::Shape(format!(
                "CUDA attention supports head_dim 16, 32, 64, 96, 128 and 256, not {head_dim}"
            )));
        }
        if n_kv == 0 || !n_head.is_multiple_of(n_kv) || n_head / n_kv > MAX_GROUP {
            return Err(CudaError::Shape(format!(
                "CUDA attention needs n_head ({n_head}) to be 1..={MAX_GROUP} times n_head_kv ({n_kv})"
            )));
        }
        let per = n_layer * n_kv * kv_head_bytes(elem, n_ctx, head_dim);
        i32_dim("cache positions", n_ctx)?;
        let max_split = n_ctx.div_ceil(ATT_CHUNK_MIN);
        Ok(DevKv {
            n_layer,
            n_ctx,
            n_kv,
            head_dim,
            n_head,
            elem,
            k: self.alloc(per)?,
            v: self.alloc(per)?,
            max_split,
            part_o: self.alloc(n_head * max_split * head_dim * 4)?,
            part_ml: self.alloc(n_head * max_split * 8)?,
            paged_part: None,
        })
    }

    /// The stored bytes of `layer`'s keys and values (its `n_kv` head regions, laid out as
    /// `crate::kv_layout` says): for tests.
    pub fn read_kv_layer(&self, kv: &DevKv, layer: usize) -> Result<(Vec<u8>, Vec<u8>), CudaError> {
        if layer >= kv.n_layer {
            return Err(CudaError::Shape(format!(
                "read_kv_layer: layer {layer} of {}",
                kv.n_layer
            )));
        }
        self.sync()?;
        let bytes = kv.layer_bytes();
        let mut out = (vec![0u8; bytes], vec![0u8; bytes]);
        for (dst, src) in [(&mut out.0, &kv.k), (&mut out.1, &kv.v)] {
            // SAFETY: `src` holds `n_layer` layers of `bytes`; the stream is synchronized
            // before `dst` is read.
            unsafe {
                result::memcpy_dtoh_async(
                    dst.as_mut_slice(),
                    src.ptr.at(layer * bytes).0,
                    self.stream.cu_stream(),
                )
            }
            .map_err(call("reading the KV cache back"))?;
        }
        self.stream.synchronize().map_err(call("synchronizing"))?;
        Ok(out)
    }

    /// Uploads host f32 `[n, width]` into `x` (tests and the hybrid path).
    pub fn write(&self, x: &DevAct, data: &[f32]) -> Result<(), CudaError> {
        if data.len() != x.n * x.width {
            return Err(CudaError::Shape(format!(
                "write: {} values into [{}, {}]",
                data.len(),
                x.n,
                x.width
            )));
        }
        // Everything recorded before must run first: it may read the old contents.
        self.sync()?;
        // SAFETY: `x.x` holds `n * width` f32.
        unsafe { result::memcpy_htod_async(x.x.ptr.0, data, self.stream.cu_stream()) }
            .map_err(call("writing an activation"))?;
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }
}
