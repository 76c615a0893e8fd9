//! HTTP(S) downloads with resume, a progress bar and an optional SHA-256 check.
//!
//! Bytes go to `<dest>.part`; an interrupted transfer is resumed with a `Range: bytes=N-`
//! request (on the next attempt, or the next run). Only a complete, verified file is renamed
//! to `dest`, so a half file never appears under the final name.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::checksum::sha256_file;
use crate::{HubError, Sha256Digest, create_dir_all};

/// Knobs for [`download`].
#[derive(Debug, Clone)]
pub struct DownloadOptions {
    /// Expected SHA-256 of the whole file; checked before the final rename.
    pub sha256: Option<Sha256Digest>,
    /// How many requests to make before giving up (each resumes where the last stopped).
    pub max_attempts: u32,
    /// Pause before retry number `k` is `retry_delay * k`.
    pub retry_delay: Duration,
    /// Give up on a connection that sends nothing for this long.
    pub read_timeout: Duration,
    /// Draw a progress bar on stderr (only when stderr is a terminal).
    pub progress: bool,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        Self {
            sha256: None,
            max_attempts: 5,
            retry_delay: Duration::from_millis(500),
            read_timeout: Duration::from_secs(60),
            progress: true,
        }
    }
}

/// The `.part` file that holds an unfinished download of `dest`.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".part");
    dest.with_file_name(name)
}

/// How one request ended.
enum Attempt {
    /// The whole body is in the `.part` file.
    Complete,
    /// A transient failure; try again (resuming).
    Retry(String),
}

/// Download `url` to `dest`, resuming `<dest>.part` if present. If `dest` already exists it
/// is kept (and checked against `opts.sha256` when one is given).
pub fn download(url: &str, dest: &Path, opts: &DownloadOptions) -> Result<(), HubError> {
    if dest.is_file() {
        if let Some(want) = opts.sha256 {
            check_sha(dest, url, want)?;
        }
        return Ok(());
    }
    if let Some(dir) = dest.parent() {
        create_dir_all(dir)?;
    }
    let part = part_path(dest);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(opts.read_timeout))
        .build()
        .into();
    eprintln!("damascus: downloading {url}");
    let bar = if opts.progress {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    let mut attempts = 0;
    let mut last = String::new();
    let complete = loop {
        if attempts >= opts.max_attempts.max(1) {
            break false;
        }
        if attempts > 0 {
            std::thread::sleep(opts.retry_delay * attempts);
        }
        attempts += 1;
        match attempt(&agent, url, &part, &bar)? {
            Attempt::Complete => break true,
            Attempt::Retry(msg) => {
                bar.suspend(|| {
                    eprintln!(
                        "damascus: {msg}; retrying ({attempts}/{})",
                        opts.max_attempts
                    )
                });
                last = msg;
            }
        }
    };
    bar.finish_and_clear();
    if !complete {
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        return Err(HubError::Transfer {
            url: url.to_string(),
            message: last,
            attempts,
            have,
            part,
        });
    }
    if let Some(want) = opts.sha256
        && let Err(e) = check_sha(&part, url, want)
    {
        // A wrong file must not be resumed on the next run.
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, dest).map_err(|e| HubError::io("rename into", dest, e))?;
    eprintln!("damascus: saved {}", dest.display());
    Ok(())
}

fn check_sha(path: &Path, url: &str, want: Sha256Digest) -> Result<(), HubError> {
    let got = sha256_file(path)?;
    if got == want {
        Ok(())
    } else {
        Err(HubError::Checksum {
            what: url.to_string(),
            expected: want.to_hex(),
            found: got.to_hex(),
        })
    }
}

/// Parse `Content-Range: bytes START-END/TOTAL` (TOTAL may be `*`).
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let total = if total.trim() == "*" {
        None
    } else {
        Some(total.trim().parse().ok()?)
    };
    Some((start.trim().parse().ok()?, total))
}

/// One request: ask for the bytes after what `.part` holds and append them.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    part: &Path,
    bar: &ProgressBar,
) -> Result<Attempt, HubError> {
    let have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    let mut req = agent.get(url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(e) => return Ok(Attempt::Retry(e.to_string())),
    };
    let status = resp.status().as_u16();
    let header = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (start, total) = match status {
        206 => match header("content-range")
            .as_deref()
            .and_then(parse_content_range)
        {
            Some((start, total)) if start == have => (start, total),
            _ => {
                // The server resumed somewhere else: start over from byte 0.
                let _ = std::fs::remove_file(part);
                return Ok(Attempt::Retry(
                    "server answered the range request with another range".into(),
                ));
            }
        },
        200 => (
            0,
            header("content-length").and_then(|v| v.trim().parse().ok()),
        ),
        416 if have > 0 => {
            let _ = std::fs::remove_file(part);
            return Ok(Attempt::Retry(
                "server refused to resume; starting over".into(),
            ));
        }
        408 | 429 | 500..=599 => return Ok(Attempt::Retry(format!("HTTP status {status}"))),
        _ => {
            return Err(HubError::HttpStatus {
                url: url.to_string(),
                status,
            });
        }
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(start > 0)
        .truncate(start == 0)
        .open(part)
        .map_err(|e| HubError::io("open", part, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    if let Some(t) = total {
        bar.set_length(t);
        bar.set_style(
            ProgressStyle::with_template(
                "{bytes:>10}/{total_bytes} [{bar:30}] {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
    }
    bar.set_position(start);
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 16]; // [64 KiB] transfer scratch
    let mut now = start;
    let read_error = loop {
        match body.read(&mut buf) {
            Ok(0) => break None,
            Ok(k) => {
                out.write_all(&buf[..k])
                    .map_err(|e| HubError::io("write", part, e))?;
                now += k as u64;
                bar.set_position(now);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Some(e.to_string()),
        }
    };
    let file = out
        .into_inner()
        .map_err(|e| HubError::io("write", part, e.into_error()))?;
    file.sync_all().map_err(|e| HubError::io("sync", part, e))?;
    if let Some(msg) = read_error {
        return Ok(Attempt::Retry(format!(
            "transfer interrupted at byte {now}: {msg}"
        )));
    }
    match total {
        Some(t) if now < t => Ok(Attempt::Retry(format!(
            "connection closed at byte {now} of {t}"
        ))),
        Some(t) if now > t => Err(HubError::Size {
            what: url.to_string(),
            expected: t,
            found: now,
        }),
        _ => Ok(Attempt::Complete),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parsing() {
        assert_eq!(
            parse_content_range("bytes 100-199/200"),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("bytes */200"), None);
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }
}
