//! `damascus device-info [--json]` (also `damascus --device-info`): the CPU (model, cores,
//! caches, memory), each SIMD feature detected at run time, the kernel path Damascus would
//! pick, and any CUDA device the driver reports.

use damascus_kernels::cpu::{CpuFeatures, CpuInfo, Isa};
use damascus_kernels::cuda_probe::{CudaStatus, probe_cuda};
use serde_json::json;

/// Flags of `damascus device-info`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `damascus device-info`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let info = CpuInfo::gather();
    let features = CpuFeatures::get();
    let isa = Isa::detect();
    let cuda = probe_cuda();
    if args.json {
        print_json(&info, features, &isa, &cuda)?;
    } else {
        print_text(&info, features, &isa, &cuda)?;
    }
    // A forced ISA this CPU lacks is an error (after printing what we know).
    isa.map(|_| ()).map_err(Into::into)
}

fn print_text(
    info: &CpuInfo,
    f: &CpuFeatures,
    isa: &Result<Isa, damascus_kernels::cpu::IsaError>,
    cuda: &CudaStatus,
) -> std::io::Result<()> {
    let unknown = || "unknown".to_string();
    let model = info.model.clone().unwrap_or_else(unknown);
    match &info.vendor {
        Some(v) => outln!("cpu      {model} ({v})")?,
        None => outln!("cpu      {model}")?,
    }
    let n = |x: Option<usize>| x.map(|v| v.to_string()).unwrap_or_else(unknown);
    let usable = match (info.usable_threads, info.threads) {
        (Some(u), Some(t)) if u != t => format!(" ({u} usable)"),
        _ => String::new(),
    };
    outln!(
        "cores    {} cores · {} threads{usable}",
        n(info.cores),
        n(info.threads)
    )?;
    if info.caches.is_empty() {
        outln!("caches   unknown")?;
    } else {
        let caches: Vec<String> = info
            .caches
            .iter()
            .map(|c| format!("{} {}", c.label(), human(c.size_bytes)))
            .collect();
        outln!("caches   {}", caches.join(" · "))?;
    }
    let mem = |x: Option<u64>| x.map(human).unwrap_or_else(unknown);
    outln!(
        "memory   {} total · {} available",
        mem(info.mem_total),
        mem(info.mem_available)
    )?;
    let feats: Vec<String> = f
        .list()
        .iter()
        .map(|(name, on)| format!("{name} {}", if *on { "✓" } else { "✗" }))
        .collect();
    outln!("simd     {}", feats[..5].join(" · "))?;
    outln!("         {}", feats[5..10].join(" · "))?;
    outln!("         {}", feats[10..].join(" · "))?;
    let forced = std::env::var("DAMASCUS_ISA")
        .ok()
        .filter(|s| !s.trim().is_empty());
    match isa {
        Ok(i) => {
            let how = if forced.is_some() {
                "forced by DAMASCUS_ISA"
            } else {
                "best available"
            };
            outln!("kernels  {i}: {} ({how})", i.describe())?;
        }
        Err(e) => outln!("kernels  error: {e}")?,
    }
    match cuda {
        CudaStatus::Ok {
            devices,
            driver_version,
        } if !devices.is_empty() => {
            for d in devices {
                outln!(
                    "cuda     #{} {} · {} · {} SMs · compute capability {}.{} · driver {}.{}",
                    d.index,
                    d.name,
                    human(d.total_mem),
                    d.sm_count,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    driver_version / 1000,
                    (driver_version % 1000) / 10
                )?;
            }
        }
        CudaStatus::Ok { .. } => outln!("cuda     no CUDA device (the driver reports none)")?,
        CudaStatus::NoDriver(why) => outln!("cuda     no CUDA device ({why})")?,
        CudaStatus::DriverError { call, code } => {
            outln!("cuda     no CUDA device ({call} failed with CUresult {code})")?
        }
    }
    outln!(
        "cuda     backend {}",
        if damascus_cuda::BUILT_WITH_CUDA {
            "built in (--backend cuda; NVRTC + cuBLAS 13 loaded at run time)"
        } else {
            "not in this build (cargo build --release --features cuda)"
        }
    )
}

fn print_json(
    info: &CpuInfo,
    f: &CpuFeatures,
    isa: &Result<Isa, damascus_kernels::cpu::IsaError>,
    cuda: &CudaStatus,
) -> anyhow::Result<()> {
    let features: serde_json::Map<String, serde_json::Value> = f
        .list()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let caches: Vec<_> = info
        .caches
        .iter()
        .map(|c| json!({"name": c.label(), "level": c.level, "type": c.kind, "size_bytes": c.size_bytes, "shared_by": c.shared_by}))
        .collect();
    let kernels = match isa {
        Ok(i) => json!({"isa": i.name(), "description": i.describe()}),
        Err(e) => json!({"error": e.to_string()}),
    };
    let cuda = match cuda {
        CudaStatus::Ok {
            driver_version,
            devices,
        } => json!({
            "driver_version": driver_version,
            "devices": devices.iter().map(|d| json!({
                "index": d.index, "name": d.name, "total_mem": d.total_mem, "sm_count": d.sm_count,
                "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
            })).collect::<Vec<_>>(),
        }),
        CudaStatus::NoDriver(why) => json!({"devices": [], "error": why}),
        CudaStatus::DriverError { call, code } => {
            json!({"devices": [], "error": format!("{call} failed with CUresult {code}")})
        }
    };
    let j = json!({
        "cpu": {
            "vendor": info.vendor, "model": info.model, "cores": info.cores, "threads": info.threads,
            "usable_threads": info.usable_threads, "caches": caches,
        },
        "memory": {"total_bytes": info.mem_total, "available_bytes": info.mem_available},
        "features": features,
        "amx_os_enabled": f.amx_os_enabled,
        "kernels": kernels,
        "cuda": cuda,
        "cuda_backend_built": damascus_cuda::BUILT_WITH_CUDA,
    });
    outln!("{}", serde_json::to_string_pretty(&j)?)?;
    Ok(())
}

/// Bytes as `32 KiB`, `23.4 GiB` (no decimals below MiB).
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 || u < 2 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
