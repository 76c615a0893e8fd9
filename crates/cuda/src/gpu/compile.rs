//! Compiling the kernels: [`super::SOURCE`] cut into one NVRTC program per kernel definition,
//! compiled on several threads, the PTX cached on disk by hash.
//!
//! One program for the whole source took 60–90 s on a fresh machine (the attention
//! templates alone are four definitions of ~10 s each), and every first start paid it. Here
//! program `i` is the whole source with only the `i`-th `extern "C" __global__` definition
//! kept as a kernel: every other definition becomes an uninstantiated template
//! (`template <int = 0> __global__`), which NVRTC parses but never compiles, so each program
//! pays for its own kernels only. With enough cores a first start takes about as long as the
//! slowest definition (about 11 s on a Zen 5 core); on 2 cores the whole compile takes 26 s
//! against 61–76 s as one program. The device functions every kernel uses are the same text
//! in every program, so each kernel's PTX is the single program's, up to label and call
//! numbering (`tests/compile_units.rs` compares them entry by entry).
//!
//! The cache file holds the programs' PTX in order, separated by [`UNIT_SEP`]; its name hashes
//! the source, the architecture, the NVRTC version and the cut, so an edit to any of them
//! misses the cache instead of loading stale kernels.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::SOURCE;
use crate::error::CudaError;

/// What starts a kernel definition in the source.
const KERNEL: &str = "extern \"C\" __global__";
/// What the definitions another program owns become: a template nothing instantiates.
const SKIPPED: &str = "template <int = 0> __global__";
/// Between two programs' PTX in the cache file (a PTX comment line NVRTC never writes).
pub const UNIT_SEP: &str = "\n// ---- damascus: next compilation unit ----\n";
/// Most programs compiled at once (each NVRTC instance holds a few hundred MB at its peak).
const MAX_THREADS: usize = 8;

/// The programs `source` is compiled as: program `i` keeps only the `i`-th kernel definition
/// (a macro that defines several kernels is one definition). A source without a kernel is one
/// program.
pub fn unit_sources(source: &str) -> Vec<String> {
    let parts: Vec<&str> = source.split(KERNEL).collect();
    if parts.len() < 2 {
        return vec![source.to_string()];
    }
    (0..parts.len() - 1)
        .map(|unit| {
            let mut s = String::with_capacity(source.len() + 16 * parts.len());
            s.push_str(parts[0]);
            for (i, p) in parts[1..].iter().enumerate() {
                s.push_str(if i == unit { KERNEL } else { SKIPPED });
                s.push_str(p);
            }
            s
        })
        .collect()
}

/// The order programs are handed to the threads, slowest first by a guess from the text: a
/// macro whose name pastes both a head size and a cache type (`attn_split_##D##SUF`: one
/// kernel per combination, ~10 s each for the split and prefill attention) before one that
/// pastes one, before plain kernels; longer definitions first within each.
fn heaviest_first(source: &str) -> Vec<usize> {
    let defs: Vec<&str> = source.split(KERNEL).skip(1).collect();
    let mut order: Vec<usize> = (0..defs.len().max(1)).collect();
    order.sort_by_key(|&i| {
        let d = defs.get(i).copied().unwrap_or("");
        let head = &d[..d.find('{').unwrap_or(d.len())];
        std::cmp::Reverse((head.matches("##").count(), d.len()))
    });
    order
}

fn cache_path(arch: &str, n_units: usize) -> Option<PathBuf> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(SOURCE.as_bytes());
    h.update(arch.as_bytes());
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints; NVRTC was found loadable before this runs.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    h.update(format!("nvrtc {major}.{minor}").as_bytes());
    h.update(format!("units {n_units}").as_bytes());
    let hex: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = damascus_hub::cache_dir().ok()?.join("cuda");
    Some(dir.join(format!("damascus-{arch}-{hex}.ptx")))
}

/// One program's PTX for `arch`.
pub fn compile_unit(src: &str, arch: &'static str) -> Result<String, CudaError> {
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            CudaError::Compile(log.to_string_lossy().into_owned())
        }
        other => CudaError::Compile(format!("{other:?}")),
    })?;
    Ok(ptx.to_src())
}

/// Whether NVRTC can be loaded (the driver and a GPU are not needed to compile).
pub fn nvrtc_present() -> bool {
    // SAFETY: this only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The entries of the PTX module `ptx` with their bodies (`{ .. }`), in one pass over the
/// text; an entry without a whole body ends the walk.
pub fn entry_bodies(ptx: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry ") {
        rest = &rest[at + ".entry ".len()..];
        let Some(paren) = rest.find('(') else { break };
        let name = rest[..paren].trim();
        let Some(open) = rest.find('{') else { break };
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        out.push((name, &rest[open..=end]));
        rest = &rest[end..];
    }
    out
}

/// Every program of [`unit_sources`]`(SOURCE)` compiled for `arch` (no cache), on up to
/// eight threads.
pub fn compile_units(arch: &'static str) -> Result<Vec<String>, CudaError> {
    let units = unit_sources(SOURCE);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
        .min(units.len());
    compile_all(&units, &heaviest_first(SOURCE), arch, threads)
}

/// Every program of `units` compiled for `arch`, `threads` at a time, in `order`.
fn compile_all(
    units: &[String],
    order: &[usize],
    arch: &'static str,
    threads: usize,
) -> Result<Vec<String>, CudaError> {
    let done: Vec<Mutex<Option<Result<String, CudaError>>>> =
        units.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(&u) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            let r = compile_unit(&units[u], arch);
            *done[u].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    done.into_iter()
        .enumerate()
        .map(|(u, r)| {
            r.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| Err(CudaError::Compile(format!("program {u} was not compiled"))))
        })
        .collect()
}

/// Where [`ptx_units`] caches the kernels for `arch` (under `DAMASCUS_HOME`), if anywhere.
pub fn cache_file(arch: &str) -> Option<PathBuf> {
    cache_path(arch, SOURCE.matches(KERNEL).count().max(1))
}

/// The PTX of every program for `arch`, from the disk cache ([`cache_file`]) or
/// [`compile_units`] (the result is written back to the cache).
pub fn ptx_units(arch: &'static str) -> Result<Vec<String>, CudaError> {
    let n_units = SOURCE.matches(KERNEL).count().max(1);
    let path = cache_file(arch);
    if let Some(p) = &path
        && let Ok(s) = std::fs::read_to_string(p)
    {
        let cached: Vec<String> = s.split(UNIT_SEP).map(str::to_string).collect();
        if cached.len() == n_units {
            return Ok(cached);
        }
    }
    let ptx = compile_units(arch)?;
    if let Some(p) = &path
        && let Some(dir) = p.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        // Write then rename: a concurrent reader never sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, ptx.join(UNIT_SEP)).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_program_keeps_one_definition_and_the_rest_of_the_text() {
        let src = "A extern \"C\" __global__ void f() {}\n#define M(N) extern \"C\" __global__ \
                   void g##N() {}\nM(1) extern \"C\" __global__ void h() {}";
        let units = unit_sources(src);
        assert_eq!(units.len(), 3);
        for (i, u) in units.iter().enumerate() {
            assert_eq!(u.matches(KERNEL).count(), 1, "program {i}: {u}");
            assert_eq!(u.matches(SKIPPED).count(), 2);
            // Only the three markers differ from the source.
            assert_eq!(u.replace(SKIPPED, KERNEL), src);
        }
        assert!(units[1].contains("#define M(N) extern \"C\" __global__ void g##N()"));
        assert_eq!(unit_sources("no kernels"), vec!["no kernels".to_string()]);
        // The macro definition first, then the longest definition.
        assert_eq!(heaviest_first(src), vec![1, 0, 2]);
        // The real source: one program per definition, an attention macro first.
        assert_eq!(unit_sources(SOURCE).len(), SOURCE.matches(KERNEL).count());
        let first = heaviest_first(SOURCE)[0];
        let def = SOURCE.split(KERNEL).nth(first + 1).unwrap_or("");
        assert!(
            def[..def.find('{').unwrap_or(0)].contains("##SUF"),
            "{def:.80}"
        );
    }
}
