//! `damascus pull [NAME|URL] [--sha256 HEX]`: fetch the default model, a model known by name
//! (`gemma3-270m`; see `damascus list --known`) or a URL (resumable HTTP download) into the
//! cache, verify it, and print its path.

use anyhow::bail;
use damascus_hub::{ModelRef, Sha256Digest, classify_model, split_url_checksum};

/// Flags of `damascus pull`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// A known model name (e.g. gemma3-270m) or an http(s) URL of a GGUF file
    /// (`URL#sha256=HEX` also works). Default: the default model.
    #[arg(value_name = "NAME|URL")]
    pub url: Option<String>,
    /// Expected SHA-256 of a URL download (64 hex digits).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
}

/// Run `damascus pull`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = args.url.as_deref();
    let what = classify_model(spec).map_err(|e| match (spec, e) {
        // `pull` takes a URL or a name; a missing local path is neither.
        (Some(s), damascus_hub::HubError::NotFound(_)) => anyhow::anyhow!(
            "{s} is not an http(s) URL nor a known model name (known: {})",
            damascus_hub::known_names()
        ),
        (_, e) => e.into(),
    })?;
    let path = match what {
        ModelRef::Default | ModelRef::Known(_) if args.sha256.is_some() => {
            bail!("--sha256 applies to URLs; the checksums of named models are pinned")
        }
        ModelRef::Default => damascus_hub::default_model_path()?,
        ModelRef::Known(m) => damascus_hub::known_model_path(m.name)?,
        ModelRef::Path(p) => {
            bail!("{} is a local file (local files need no pull)", p.display())
        }
        ModelRef::Url(spec) => {
            let (url, from_fragment) = split_url_checksum(&spec)?;
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
