//! Compiles the kernels for an architecture into the disk cache `Gpu::open` reads (under
//! `DAMASCUS_HOME`), on a machine with NVRTC and no GPU, and prints the file's path: so a fresh
//! GPU machine skips the compile (`tools/device_pack.sh`). A developer tool.
//!
//! `LD_LIBRARY_PATH=/path/to/nvrtc/lib cargo run --release -p damascus-cuda --features cuda \
//!  --example cuda_precompile -- [compute_90]`

use damascus_cuda::gpu::compile::{cache_file, nvrtc_present, ptx_units};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !nvrtc_present() {
        return Err(
            "NVRTC (libnvrtc.so.13) was not found: add its directory to LD_LIBRARY_PATH".into(),
        );
    }
    let arch: &'static str = std::env::args()
        .nth(1)
        .map_or("compute_90", |a| Box::leak(a.into_boxed_str()));
    let t0 = std::time::Instant::now();
    let units = ptx_units(arch)?;
    let path = cache_file(arch).ok_or("no cache directory (set DAMASCUS_HOME)")?;
    if !path.exists() {
        return Err(format!("{} was not written", path.display()).into());
    }
    eprintln!(
        "{} programs for {arch} in {:.1} s",
        units.len(),
        t0.elapsed().as_secs_f64()
    );
    println!("{}", path.display());
    Ok(())
}
