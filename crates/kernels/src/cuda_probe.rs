//! Is there a CUDA GPU? Loads the driver library (`libcuda.so.1`) at run time, if present,
//! and asks it for each device's name, memory, SM count and compute capability. Nothing
//! links against CUDA at build time; a missing driver is a normal answer, not an error.

use std::ffi::{c_char, c_int, c_uint};

/// One CUDA device as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDevice {
    /// Ordinal (0-based).
    pub index: i32,
    /// Marketing name ("NVIDIA H200").
    pub name: String,
    /// Total memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
}

/// What the CUDA probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaStatus {
    /// The driver library could not be loaded (no NVIDIA driver).
    NoDriver(String),
    /// The driver loaded but a call failed (e.g. `cuInit` returned an error code).
    DriverError {
        /// The failing call.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
    },
    /// The driver answered; `devices` may be empty.
    Ok {
        /// Driver API version, e.g. 12040 for 12.4.
        driver_version: i32,
        /// Devices found.
        devices: Vec<CudaDevice>,
    },
}

impl CudaStatus {
    /// The devices, empty unless the driver answered.
    pub fn devices(&self) -> &[CudaDevice] {
        match self {
            CudaStatus::Ok { devices, .. } => devices,
            _ => &[],
        }
    }
}

#[cfg(target_os = "windows")]
const LIB_NAMES: &[&str] = &["nvcuda.dll"];
#[cfg(not(target_os = "windows"))]
const LIB_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

// CUdevice_attribute values from the CUDA driver API.
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// Probe for CUDA devices. Never panics; safe to call on machines without a GPU.
pub fn probe_cuda() -> CudaStatus {
    let mut last_err = String::new();
    for name in LIB_NAMES {
        // SAFETY: loading the NVIDIA driver library runs its initializers, which are
        // designed to be loaded by any process; we keep it loaded for the duration of use.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return query(&lib),
            Err(e) if last_err.is_empty() => last_err = e.to_string(),
            Err(_) => {}
        }
    }
    CudaStatus::NoDriver(last_err)
}

/// Look up the first of `names` (NUL-terminated) that the driver exports.
///
/// # Safety
/// `T` must be the C signature of every symbol named.
unsafe fn sym<'l, T>(
    lib: &'l libloading::Library,
    names: &[&[u8]],
) -> Result<libloading::Symbol<'l, T>, CudaStatus> {
    for n in names {
        // SAFETY: the caller guarantees `T` matches the symbol's signature.
        if let Ok(f) = unsafe { lib.get::<T>(n) } {
            return Ok(f);
        }
    }
    let first = names
        .first()
        .map(|n| {
            String::from_utf8_lossy(n)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
    Err(CudaStatus::NoDriver(format!(
        "symbol {first} missing from the CUDA driver"
    )))
}

fn query(lib: &libloading::Library) -> CudaStatus {
    // SAFETY: each type alias is the documented C signature of the named driver API
    // symbol (the `_v2` memory query is the 64-bit-size variant).
    let syms = unsafe {
        (|| -> Result<_, CudaStatus> {
            Ok((
                sym::<CuInit>(lib, &[b"cuInit\0"])?,
                sym::<CuIntOut>(lib, &[b"cuDriverGetVersion\0"])?,
                sym::<CuIntOut>(lib, &[b"cuDeviceGetCount\0"])?,
                sym::<CuDeviceGet>(lib, &[b"cuDeviceGet\0"])?,
                sym::<CuDeviceGetName>(lib, &[b"cuDeviceGetName\0"])?,
                sym::<CuDeviceTotalMem>(lib, &[b"cuDeviceTotalMem_v2\0", b"cuDeviceTotalMem\0"])?,
                sym::<CuDeviceGetAttribute>(lib, &[b"cuDeviceGetAttribute\0"])?,
            ))
        })()
    };
    let (cu_init, cu_driver_version, cu_count, cu_get, cu_name, cu_mem, cu_attr) = match syms {
        Ok(s) => s,
        Err(e) => return e,
    };

    // SAFETY (all calls below): the function pointers come from the driver with the
    // documented signatures; every out-pointer points to a live local of the right type,
    // and the name buffer's length is passed alongside it.
    let check = |call: &'static str, code: c_int| {
        if code == 0 {
            Ok(())
        } else {
            Err(CudaStatus::DriverError { call, code })
        }
    };
    let run = || -> Result<CudaStatus, CudaStatus> {
        check("cuInit", unsafe { cu_init(0) })?;
        let mut driver_version: c_int = 0;
        check("cuDriverGetVersion", unsafe {
            cu_driver_version(&mut driver_version)
        })?;
        let mut n: c_int = 0;
        check("cuDeviceGetCount", unsafe { cu_count(&mut n) })?;
        let mut devices = Vec::new();
        for i in 0..n.clamp(0, 64) {
            let mut dev: c_int = 0;
            check("cuDeviceGet", unsafe { cu_get(&mut dev, i) })?;
            let mut buf = [0 as c_char; 256];
            check("cuDeviceGetName", unsafe {
                cu_name(buf.as_mut_ptr(), buf.len() as c_int, dev)
            })?;
            let bytes: Vec<u8> = buf
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            let mut mem: usize = 0;
            check("cuDeviceTotalMem", unsafe { cu_mem(&mut mem, dev) })?;
            let attr = |a: c_int| -> Result<i32, CudaStatus> {
                let mut v: c_int = 0;
                check("cuDeviceGetAttribute", unsafe { cu_attr(&mut v, a, dev) })?;
                Ok(v)
            };
            devices.push(CudaDevice {
                index: i,
                name: String::from_utf8_lossy(&bytes).into_owned(),
                total_mem: mem as u64,
                sm_count: attr(ATTR_MULTIPROCESSOR_COUNT)?,
                compute_capability: (
                    attr(ATTR_COMPUTE_CAPABILITY_MAJOR)?,
                    attr(ATTR_COMPUTE_CAPABILITY_MINOR)?,
                ),
            });
        }
        Ok(CudaStatus::Ok {
            driver_version,
            devices,
        })
    };
    run().unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        match probe_cuda() {
            CudaStatus::NoDriver(why) => assert!(!why.is_empty()),
            CudaStatus::DriverError { call, .. } => assert!(!call.is_empty()),
            CudaStatus::Ok { devices, .. } => {
                for d in devices {
                    assert!(
                        d.total_mem > 0 && d.sm_count > 0 && d.compute_capability.0 > 0,
                        "{d:?}"
                    );
                }
            }
        }
    }
}
