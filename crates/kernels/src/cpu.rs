//! What CPU are we on? Run-time feature detection, the ISA level kernels dispatch on, and
//! descriptive facts for `damascus device-info` (model name, cores, caches, memory).
//!
//! Features are detected at run time (never `target-cpu=native`): std's
//! `is_x86_feature_detected!` for SSE4.2 … AVX-512, raw CPUID leaf 7 for AMX (whose std
//! macro is unstable) plus XCR0 and, on Linux, the `arch_prctl` permission AMX tiles need.
//! The chosen [`Isa`] is computed once and cached; `DAMASCUS_ISA=scalar|avx2|avx512|vnni|amx`
//! forces a level, and forcing one the CPU lacks is an error, not a silent fallback.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// SIMD features detected at run time. All false on non-x86_64 targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// SSE4.2.
    pub sse4_2: bool,
    /// AVX.
    pub avx: bool,
    /// AVX2.
    pub avx2: bool,
    /// FMA3.
    pub fma: bool,
    /// F16C (half-precision conversions).
    pub f16c: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word.
    pub avx512bw: bool,
    /// AVX-512 vector-length extensions.
    pub avx512vl: bool,
    /// AVX-512 VNNI (int8 dot products).
    pub avx512vnni: bool,
    /// AVX-512 BF16.
    pub avx512bf16: bool,
    /// AMX tile architecture (CPUID.7.0:EDX\[24\]).
    pub amx_tile: bool,
    /// AMX int8 (CPUID.7.0:EDX\[25\]).
    pub amx_int8: bool,
    /// AMX bf16 (CPUID.7.0:EDX\[22\]).
    pub amx_bf16: bool,
    /// The OS saves AMX tile state (XCR0 bits 17 and 18).
    pub amx_os_enabled: bool,
}

impl CpuFeatures {
    /// Features of this CPU, detected once.
    pub fn get() -> &'static CpuFeatures {
        static F: OnceLock<CpuFeatures> = OnceLock::new();
        F.get_or_init(CpuFeatures::detect)
    }

    /// The features kernels may use: [`CpuFeatures::get`] with everything above the chosen
    /// [`Isa`] ([`Isa::detect`], so `DAMASCUS_ISA`) turned off. Helpers that pick their own
    /// SIMD body (prompt attention, unpackers, elementwise ops) dispatch on this, so a forced
    /// level runs their bodies of that level too. Computed once.
    pub fn allowed() -> &'static CpuFeatures {
        static F: OnceLock<CpuFeatures> = OnceLock::new();
        F.get_or_init(|| {
            let isa = Isa::detect().unwrap_or_else(|_| Isa::best());
            CpuFeatures::get().masked(isa)
        })
    }

    /// These features with everything above `isa` turned off.
    pub fn masked(&self, isa: Isa) -> CpuFeatures {
        let mut f = *self;
        if isa < Isa::Amx {
            f.amx_tile = false;
            f.amx_int8 = false;
            f.amx_bf16 = false;
        }
        if isa < Isa::Vnni {
            f.avx512vnni = false;
        }
        if isa < Isa::Avx512 {
            f.avx512bf16 = false;
            f.avx512f = false;
            f.avx512bw = false;
            f.avx512vl = false;
        }
        if isa < Isa::Avx2 {
            f.avx2 = false;
            f.fma = false;
            f.f16c = false;
        }
        f
    }

    /// Detect now (uncached).
    #[cfg(target_arch = "x86_64")]
    pub fn detect() -> CpuFeatures {
        use std::arch::is_x86_feature_detected as has;
        let amx = amx_cpuid();
        CpuFeatures {
            sse4_2: has!("sse4.2"),
            avx: has!("avx"),
            avx2: has!("avx2"),
            fma: has!("fma"),
            f16c: has!("f16c"),
            avx512f: has!("avx512f"),
            avx512bw: has!("avx512bw"),
            avx512vl: has!("avx512vl"),
            avx512vnni: has!("avx512vnni"),
            avx512bf16: has!("avx512bf16"),
            amx_tile: amx.tile,
            amx_int8: amx.int8,
            amx_bf16: amx.bf16,
            amx_os_enabled: amx.os_enabled,
        }
    }

    /// Detect now (uncached).
    #[cfg(not(target_arch = "x86_64"))]
    pub fn detect() -> CpuFeatures {
        CpuFeatures::default()
    }

    /// `(display name, present)` for every feature, in the order `device-info` prints them.
    pub fn list(&self) -> [(&'static str, bool); 13] {
        [
            ("SSE4.2", self.sse4_2),
            ("AVX", self.avx),
            ("AVX2", self.avx2),
            ("FMA", self.fma),
            ("F16C", self.f16c),
            ("AVX-512F", self.avx512f),
            ("AVX-512BW", self.avx512bw),
            ("AVX-512VL", self.avx512vl),
            ("AVX-512VNNI", self.avx512vnni),
            ("AVX-512BF16", self.avx512bf16),
            ("AMX-TILE", self.amx_tile),
            ("AMX-INT8", self.amx_int8),
            ("AMX-BF16", self.amx_bf16),
        ]
    }
}

#[cfg(target_arch = "x86_64")]
struct AmxCpuid {
    tile: bool,
    int8: bool,
    bf16: bool,
    os_enabled: bool,
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)] // `__cpuid_count` is a safe fn on newer toolchains.
fn amx_cpuid() -> AmxCpuid {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86_64 CPU; leaf 0 gives the highest basic leaf.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return AmxCpuid {
            tile: false,
            int8: false,
            bf16: false,
            os_enabled: false,
        };
    }
    // SAFETY: leaf 7 is supported (checked above).
    let edx = unsafe { __cpuid_count(7, 0) }.edx;
    // SAFETY: leaf 1 is always supported; ECX bit 27 = OSXSAVE (XGETBV usable).
    let osxsave = unsafe { __cpuid(1) }.ecx & (1 << 27) != 0;
    let os_enabled = osxsave && {
        // SAFETY: OSXSAVE is set, so the OS enabled XSAVE and XGETBV(0) is legal.
        let xcr0 = unsafe { xgetbv0() };
        xcr0 & (0b11 << 17) == (0b11 << 17)
    };
    AmxCpuid {
        tile: edx & (1 << 24) != 0,
        int8: edx & (1 << 25) != 0,
        bf16: edx & (1 << 22) != 0,
        os_enabled,
    }
}

/// # Safety
/// The CPU must support XSAVE with OSXSAVE enabled (CPUID.1:ECX[27]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    // SAFETY: guaranteed by the caller.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// Ask Linux for permission to use AMX tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`); required once per process before any AMX instruction. Cached.
pub fn amx_permission() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    *P.get_or_init(request_amx_permission)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_amx_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only reads its integer arguments; it
    // fails harmlessly (EINVAL/EPERM) where AMX is unsupported.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_amx_permission() -> bool {
    false
}

/// Kernel instruction-set level, lowest first. Each level implies the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable scalar code (the reference).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL on top of AVX2.
    Avx512,
    /// AVX-512 VNNI int8 dot products on top of AVX-512.
    Vnni,
    /// AMX tiles (the int8 or bf16 prefill GEMM) on top of the VNNI dot products.
    Amx,
}

/// Errors choosing the ISA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// `DAMASCUS_ISA` names no known level.
    #[error("DAMASCUS_ISA={0:?} is not one of scalar, avx2, avx512, vnni, amx")]
    Unknown(String),
    /// `DAMASCUS_ISA` forces a level this CPU cannot run.
    #[error("DAMASCUS_ISA={isa} is not available on this CPU (missing {missing})")]
    Unavailable {
        /// The forced level.
        isa: Isa,
        /// Comma-separated missing features.
        missing: String,
    },
    /// Process-wide kernel settings were already fixed differently.
    #[error("the kernel settings were already fixed for this process ({0})")]
    Conflict(String),
}

/// The process-wide ISA choice, made once ([`Isa::detect`] or [`Isa::set_override`]).
static CHOSEN: OnceLock<Result<Isa, IsaError>> = OnceLock::new();

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni, Isa::Amx];

    /// Lower-case name, as accepted by `DAMASCUS_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Vnni => "vnni",
            Isa::Amx => "amx",
        }
    }

    /// One-line description of the kernel path.
    pub fn describe(self) -> &'static str {
        match self {
            Isa::Scalar => "portable scalar reference kernels",
            Isa::Avx2 => "AVX2 + FMA kernels (256-bit)",
            Isa::Avx512 => "AVX-512 F/BW/VL kernels (512-bit)",
            Isa::Vnni => "AVX-512 VNNI int8 kernels (dot products; prompts: int8 GEMM)",
            Isa::Amx => "AMX tiles for prompts (prefill GEMM, int8 or bf16) + VNNI dot products",
        }
    }

    /// Features (display names) this level needs that `f` lacks; empty when available.
    /// For AMX, `amx_perm` says whether the OS granted tile permission.
    pub fn missing_in(self, f: &CpuFeatures, amx_perm: bool) -> Vec<&'static str> {
        let mut m = Vec::new();
        let mut need = |ok: bool, name: &'static str| {
            if !ok {
                m.push(name);
            }
        };
        if self >= Isa::Avx2 {
            need(f.avx2, "AVX2");
            need(f.fma, "FMA");
            need(f.f16c, "F16C");
        }
        if self >= Isa::Avx512 {
            need(f.avx512f, "AVX-512F");
            need(f.avx512bw, "AVX-512BW");
            need(f.avx512vl, "AVX-512VL");
        }
        if self >= Isa::Vnni {
            need(f.avx512vnni, "AVX-512VNNI");
        }
        if self >= Isa::Amx {
            need(f.amx_tile, "AMX-TILE");
            need(f.amx_int8, "AMX-INT8");
            need(f.amx_os_enabled, "OS support for AMX state (XCR0)");
            if f.amx_tile && f.amx_os_enabled {
                need(amx_perm, "AMX permission (arch_prctl)");
            }
        }
        m
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        let f = CpuFeatures::get();
        // Only ask the OS for AMX permission when the hardware has AMX.
        let perm = self == Isa::Amx && f.amx_tile && f.amx_os_enabled && amx_permission();
        self.missing_in(f, perm).is_empty()
    }

    /// The best level this CPU supports.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The level kernels should use: the one installed with [`Isa::set_override`] (from
    /// [`crate::settings::KernelSettings`]), else `DAMASCUS_ISA` if set (an error if this
    /// CPU lacks it), else [`Isa::best`]. Computed once per process.
    pub fn detect() -> Result<Isa, IsaError> {
        CHOSEN
            .get_or_init(|| {
                Isa::choose(
                    std::env::var("DAMASCUS_ISA").ok().as_deref(),
                    Isa::is_available,
                )
            })
            .clone()
    }

    /// Fixes the process-wide level before any kernel runs: `Some(isa)` forces it (an error if
    /// this CPU lacks it), `None` leaves the automatic choice. Once the level is chosen a
    /// different forced one is an error.
    pub fn set_override(isa: Option<Isa>) -> Result<(), IsaError> {
        let Some(isa) = isa else {
            return Isa::detect().map(|_| ());
        };
        let want = Isa::choose(Some(isa.name()), Isa::is_available);
        let got = CHOSEN.get_or_init(|| want.clone());
        match (got, want) {
            (Ok(g), Ok(w)) if *g == w => Ok(()),
            (_, Err(e)) => Err(e),
            (Ok(g), Ok(w)) => Err(IsaError::Conflict(format!("{g} in use, {w} asked"))),
            (Err(e), Ok(_)) => Err(e.clone()),
        }
    }

    /// Pure choice logic behind [`Isa::detect`]: `forced` is the `DAMASCUS_ISA` value (empty
    /// or absent = automatic), `available` tells which levels the CPU has.
    pub fn choose(forced: Option<&str>, available: impl Fn(Isa) -> bool) -> Result<Isa, IsaError> {
        match forced.map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(Isa::ALL
                .into_iter()
                .rev()
                .find(|&i| available(i))
                .unwrap_or(Isa::Scalar)),
            Some(s) => {
                let isa: Isa = s.parse()?;
                if available(isa) {
                    Ok(isa)
                } else {
                    let f = CpuFeatures::get();
                    let missing = isa.missing_in(f, isa == Isa::Amx && amx_permission());
                    let missing = if missing.is_empty() {
                        "support".to_string()
                    } else {
                        missing.join(", ")
                    };
                    Err(IsaError::Unavailable { isa, missing })
                }
            }
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = IsaError;

    fn from_str(s: &str) -> Result<Isa, IsaError> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| IsaError::Unknown(s.to_string()))
    }
}

/// One CPU cache level, from sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    /// 1, 2, 3 …
    pub level: u32,
    /// "Data", "Instruction" or "Unified".
    pub kind: String,
    /// Size in bytes (per instance).
    pub size_bytes: u64,
    /// How many logical CPUs share one instance (0 if unknown).
    pub shared_by: u32,
}

impl CacheInfo {
    /// Short label: "L1d", "L1i", "L2", "L3".
    pub fn label(&self) -> String {
        match self.kind.as_str() {
            "Data" => format!("L{}d", self.level),
            "Instruction" => format!("L{}i", self.level),
            _ => format!("L{}", self.level),
        }
    }
}

/// Descriptive facts about the host CPU and memory (best effort; `None` when unknown).
#[derive(Clone, Debug, Default)]
pub struct CpuInfo {
    /// Vendor id ("GenuineIntel", "AuthenticAMD").
    pub vendor: Option<String>,
    /// Model / brand string.
    pub model: Option<String>,
    /// Physical cores.
    pub cores: Option<usize>,
    /// Logical CPUs online.
    pub threads: Option<usize>,
    /// Logical CPUs this process may run on (affinity, cgroup quota).
    pub usable_threads: Option<usize>,
    /// Caches seen by CPU 0.
    pub caches: Vec<CacheInfo>,
    /// Total memory in bytes.
    pub mem_total: Option<u64>,
    /// Available memory in bytes.
    pub mem_available: Option<u64>,
}

impl CpuInfo {
    /// Gather everything (reads CPUID, /proc and /sys; never fails).
    pub fn gather() -> CpuInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (vendor, brand) = cpuid_strings();
        let model = brand.or_else(|| proc_field(&cpuinfo, "model name"));
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        CpuInfo {
            vendor: vendor.or_else(|| proc_field(&cpuinfo, "vendor_id")),
            model,
            cores: count_cores(&cpuinfo),
            threads: std::fs::read_to_string("/sys/devices/system/cpu/online")
                .ok()
                .and_then(|s| count_cpu_list(&s))
                .or_else(|| {
                    Some(
                        cpuinfo
                            .lines()
                            .filter(|l| l.starts_with("processor"))
                            .count(),
                    )
                    .filter(|&n| n > 0)
                }),
            usable_threads: std::thread::available_parallelism().ok().map(|n| n.get()),
            caches: read_caches(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache")),
            mem_total: meminfo_kib(&meminfo, "MemTotal").map(|k| k * 1024),
            mem_available: meminfo_kib(&meminfo, "MemAvailable").map(|k| k * 1024),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)] // `__cpuid` is a safe fn on newer toolchains.
fn cpuid_strings() -> (Option<String>, Option<String>) {
    use std::arch::x86_64::__cpuid;
    // SAFETY: CPUID exists on every x86_64 CPU.
    let l0 = unsafe { __cpuid(0) };
    let mut v = Vec::with_capacity(12);
    for r in [l0.ebx, l0.edx, l0.ecx] {
        v.extend_from_slice(&r.to_le_bytes());
    }
    let clean = |b: &[u8]| {
        let s = String::from_utf8_lossy(b)
            .trim_matches(|c: char| c == '\0' || c.is_whitespace())
            .to_string();
        Some(s).filter(|s| !s.is_empty())
    };
    // SAFETY: as above; leaf 0x8000_0000 reports the highest extended leaf.
    let max_ext = unsafe { __cpuid(0x8000_0000) }.eax;
    let brand = if max_ext >= 0x8000_0004 {
        let mut b = Vec::with_capacity(48);
        for leaf in 0x8000_0002u32..=0x8000_0004 {
            // SAFETY: the leaf is within the supported extended range (checked above).
            let r = unsafe { __cpuid(leaf) };
            for x in [r.eax, r.ebx, r.ecx, r.edx] {
                b.extend_from_slice(&x.to_le_bytes());
            }
        }
        clean(&b)
    } else {
        None
    };
    (clean(&v), brand)
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_strings() -> (Option<String>, Option<String>) {
    (None, None)
}

fn proc_field(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key)
            .then(|| v.trim().to_string())
            .filter(|v| !v.is_empty())
    })
}

/// Distinct (physical id, core id) pairs in /proc/cpuinfo.
fn count_cores(cpuinfo: &str) -> Option<usize> {
    let mut seen = std::collections::BTreeSet::new();
    let mut phys = String::new();
    for l in cpuinfo.lines() {
        if let Some((k, v)) = l.split_once(':') {
            match k.trim() {
                "physical id" => phys = v.trim().to_string(),
                "core id" => {
                    seen.insert((phys.clone(), v.trim().to_string()));
                }
                _ => {}
            }
        }
    }
    Some(seen.len()).filter(|&n| n > 0)
}

/// Count CPUs in a sysfs list like "0-3,8,10-11".
fn count_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n).filter(|&n| n > 0)
}

/// Parse a sysfs cache size ("32K", "1024K", "32M").
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1024),
        b'M' | b'm' => (&s[..s.len() - 1], 1024 * 1024),
        b'G' | b'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

fn read_caches(dir: &std::path::Path) -> Vec<CacheInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<CacheInfo> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let p = e.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
            Some(CacheInfo {
                level: read("level")?.trim().parse().ok()?,
                kind: read("type")?.trim().to_string(),
                size_bytes: parse_size(&read("size")?)?,
                shared_by: read("shared_cpu_list")
                    .and_then(|s| count_cpu_list(&s))
                    .unwrap_or(0) as u32,
            })
        })
        .collect();
    out.sort_by(|a, b| (a.level, &a.kind).cmp(&(b.level, &b.kind)));
    out
}

/// Bytes of memory and swap this machine has (`MemTotal + SwapTotal` of `/proc/meminfo`), if
/// the OS reports them: more than that, one process's allocations can never be backed.
pub fn host_memory_bytes() -> Option<u64> {
    host_memory_of(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn host_memory_of(meminfo: &str) -> Option<u64> {
    let total = meminfo_kib(meminfo, "MemTotal")?;
    Some((total + meminfo_kib(meminfo, "SwapTotal").unwrap_or(0)) * 1024)
}

fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU with every feature this module knows.
    fn every_feature() -> CpuFeatures {
        CpuFeatures {
            sse4_2: true,
            avx: true,
            avx2: true,
            fma: true,
            f16c: true,
            avx512f: true,
            avx512bw: true,
            avx512vl: true,
            avx512vnni: true,
            avx512bf16: true,
            amx_tile: true,
            amx_int8: true,
            amx_bf16: true,
            amx_os_enabled: true,
        }
    }

    #[test]
    fn masking_keeps_exactly_the_levels_at_or_below() {
        let all = every_feature();
        for isa in Isa::ALL {
            let m = all.masked(isa);
            // A level is runnable on the masked features iff it is at or below `isa`.
            for other in Isa::ALL {
                assert_eq!(
                    other.missing_in(&m, true).is_empty(),
                    other <= isa,
                    "{isa:?} masks {other:?}"
                );
            }
        }
        let s = all.masked(Isa::Scalar);
        assert!(!s.avx2 && !s.fma && !s.f16c && !s.avx512f && !s.avx512bf16 && s.sse4_2);
        // Masking never adds a feature.
        let none = CpuFeatures::default();
        assert_eq!(none.masked(Isa::Amx), none);
        // What kernels may use is what the chosen level allows.
        let isa = Isa::detect().unwrap_or_else(|_| Isa::best());
        assert_eq!(*CpuFeatures::allowed(), CpuFeatures::get().masked(isa));
    }

    #[test]
    fn names_round_trip_and_order() {
        for i in Isa::ALL {
            assert_eq!(i.name().parse::<Isa>().unwrap(), i);
        }
        assert_eq!("AVX512".parse::<Isa>().unwrap(), Isa::Avx512);
        assert!(matches!("sse".parse::<Isa>(), Err(IsaError::Unknown(_))));
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Vnni < Isa::Amx);
    }

    #[test]
    fn choose_respects_env_and_availability() {
        let upto = |max: Isa| move |i: Isa| i <= max;
        assert_eq!(Isa::choose(None, upto(Isa::Avx512)), Ok(Isa::Avx512));
        assert_eq!(Isa::choose(Some(""), upto(Isa::Avx2)), Ok(Isa::Avx2));
        assert_eq!(Isa::choose(Some("scalar"), upto(Isa::Amx)), Ok(Isa::Scalar));
        assert_eq!(Isa::choose(Some(" avx2 "), upto(Isa::Vnni)), Ok(Isa::Avx2));
        assert!(matches!(
            Isa::choose(Some("amx"), upto(Isa::Avx2)),
            Err(IsaError::Unavailable { isa: Isa::Amx, .. })
        ));
        assert!(matches!(
            Isa::choose(Some("neon"), upto(Isa::Amx)),
            Err(IsaError::Unknown(_))
        ));
        assert_eq!(Isa::choose(None, |i| i == Isa::Scalar), Ok(Isa::Scalar));
    }

    #[test]
    fn missing_features_are_named() {
        let none = CpuFeatures::default();
        assert!(Isa::Scalar.missing_in(&none, false).is_empty());
        assert_eq!(
            Isa::Avx2.missing_in(&none, false),
            vec!["AVX2", "FMA", "F16C"]
        );
        let all = every_feature();
        assert!(Isa::Amx.missing_in(&all, true).is_empty());
        assert_eq!(
            Isa::Amx.missing_in(&all, false),
            vec!["AMX permission (arch_prctl)"]
        );
    }

    #[test]
    fn detection_is_consistent() {
        let f = CpuFeatures::get();
        assert_eq!(*f, CpuFeatures::detect());
        // Each available level implies the ones below it.
        let best = Isa::best();
        for i in Isa::ALL {
            assert_eq!(i.is_available(), i <= best, "{i}");
        }
        if f.avx512f {
            assert!(f.avx2);
        }
    }

    #[test]
    fn sysfs_and_proc_parsers() {
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("x"), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(parse_size("32K\n"), Some(32 * 1024));
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("K"), None);
        let mi = "MemTotal:       24567890 kB\nMemFree: 1 kB\nMemAvailable:   123 kB\n";
        assert_eq!(meminfo_kib(mi, "MemTotal"), Some(24_567_890));
        assert_eq!(meminfo_kib(mi, "MemAvailable"), Some(123));
        assert_eq!(meminfo_kib(mi, "Mem"), None);
        let ci = "processor\t: 0\nmodel name\t: Foo CPU\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 2\nphysical id\t: 0\ncore id\t: 1\n";
        assert_eq!(count_cores(ci), Some(2));
        assert_eq!(proc_field(ci, "model name").as_deref(), Some("Foo CPU"));
    }

    #[test]
    fn host_memory_adds_swap() {
        let mi = "MemTotal: 2 kB\nSwapTotal:  3 kB\nMemAvailable: 1 kB\n";
        assert_eq!(host_memory_of(mi), Some(5 * 1024));
        assert_eq!(host_memory_of("MemTotal: 2 kB\n"), Some(2 * 1024));
        assert_eq!(host_memory_of("SwapTotal: 2 kB\n"), None);
    }

    #[test]
    fn gather_never_panics_and_finds_something_on_linux() {
        let info = CpuInfo::gather();
        if cfg!(target_os = "linux") {
            assert!(info.threads.unwrap_or(0) >= 1);
            assert!(info.mem_total.unwrap_or(0) > 0);
        }
        for c in &info.caches {
            assert!(c.size_bytes > 0 && !c.label().is_empty());
        }
    }
}
