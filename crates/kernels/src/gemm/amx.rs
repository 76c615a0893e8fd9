//! The AMX-BF16 micro-kernel, driven with stable `asm!` (the AMX intrinsics are unstable,
//! rust-lang/rust#126622; LLVM's assembler knows the mnemonics).
//!
//! Tile registers of one call: `tmm0..tmm3` = C (`[16 tokens, 16 rows]` f32, token tile `i`
//! × row group `j` in `tmm(2i + j)`), `tmm4`/`tmm5` = A (two token tiles, `[16, 32]` bf16),
//! `tmm6`/`tmm7` = B (two panel tiles, `[16 pairs, 16 rows × 2]` bf16). Every tile is 16 rows
//! of 64 bytes.

use std::arch::asm;

use super::{MicroArgs, TILE};

/// The 64-byte tile configuration (palette 1): eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const fn eight_full_tiles() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1; // palette
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64; // colsb[t] (u16, little endian)
            c[48 + t] = TILE as u8; // rows[t]
            t += 1;
        }
        TileConfig(c)
    }
}

static CONFIG: TileConfig = TileConfig::eight_full_tiles();

/// Configures this thread's tiles on creation and releases them on drop.
pub(super) struct TileGuard(());

impl TileGuard {
    /// Loads the tile configuration. Only created on the AMX path, which
    /// [`super::GemmPath::is_available`] gates on AMX-BF16 and the OS permission.
    pub(super) fn new() -> TileGuard {
        // SAFETY: AMX is available and permitted (the only caller is the AMX path); the
        // configuration is a valid palette-1 layout.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack)) };
        TileGuard(())
    }
}

impl Drop for TileGuard {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `new` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One 2 × 2 tile step sequence over `args.nks` k-steps.
///
/// # Safety
/// AMX-BF16 is available, this thread holds a [`TileGuard`], and `args` describes valid
/// memory: `nks` contiguous 1 KiB tiles per A token tile and per B group,
/// C tiles of 16 rows at their strides.
pub(super) unsafe fn micro_2x2(args: &MicroArgs) {
    let cs = args.c.stride.map(|s| s * 4); // bytes
    let [c0, c1, c2, c3] = args.c.c;
    // SAFETY: (all blocks) pointers and strides as documented; tiles configured.
    unsafe {
        if args.load_c {
            asm!(
                "tileloadd tmm0, [{c0} + {s0}]",
                "tileloadd tmm1, [{c1} + {s1}]",
                "tileloadd tmm2, [{c2} + {s2}]",
                "tileloadd tmm3, [{c3} + {s3}]",
                c0 = in(reg) c0, s0 = in(reg) cs[0],
                c1 = in(reg) c1, s1 = in(reg) cs[1],
                c2 = in(reg) c2, s2 = in(reg) cs[2],
                c3 = in(reg) c3, s3 = in(reg) cs[3],
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        let (mut a0, mut a1) = (args.a[0].cast::<u8>(), args.a[1].cast::<u8>());
        let (mut b0, mut b1) = (args.b[0].cast::<u8>(), args.b[1].cast::<u8>());
        for _ in 0..args.nks {
            asm!(
                "tileloadd tmm4, [{a0} + {as}]",
                "tileloadd tmm6, [{b0} + {bs}]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {bs}]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {as}]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0, a1 = in(reg) a1, as = in(reg) 64usize,
                b0 = in(reg) b0, b1 = in(reg) b1, bs = in(reg) 64usize,
                options(nostack, readonly),
            );
            a0 = a0.add(1024);
            a1 = a1.add(1024);
            b0 = b0.add(1024);
            b1 = b1.add(1024);
        }
        asm!(
            "tilestored [{c0} + {s0}], tmm0",
            "tilestored [{c1} + {s1}], tmm1",
            "tilestored [{c2} + {s2}], tmm2",
            "tilestored [{c3} + {s3}], tmm3",
            c0 = in(reg) c0, s0 = in(reg) cs[0],
            c1 = in(reg) c1, s1 = in(reg) cs[1],
            c2 = in(reg) c2, s2 = in(reg) cs[2],
            c3 = in(reg) c3, s3 = in(reg) cs[3],
            options(nostack),
        );
    }
}
