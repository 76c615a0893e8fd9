//! Downloads against a tiny HTTP/1.1 server on 127.0.0.1 that supports `Range` and can cut
//! the connection mid-body, to exercise resume, checksums and the never-a-half-file rule.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use damascus_hub::{DownloadOptions, HubError, Sha256Digest, download};

/// What the server does on one connection.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Serve the request properly (honouring `Range`).
    Normal,
    /// Send the headers and only this many body bytes, then close.
    CutAfter(usize),
    /// Answer 200 with the whole body even when a range was asked for.
    IgnoreRange,
    /// Answer with this status and an empty body.
    Status(u16),
}

struct Server {
    url: String,
    /// The `Range` header of each request, in order (None when absent).
    ranges: Arc<Mutex<Vec<Option<String>>>>,
}

/// Serve `data` at `/model.gguf`, one behaviour per connection (then `Normal`). The thread
/// stops by itself after 10 s or 32 connections.
fn serve(data: Vec<u8>, plan: Vec<Behaviour>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/model.gguf", listener.local_addr().unwrap());
    let ranges = Arc::new(Mutex::new(Vec::new()));
    let log = ranges.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        while Instant::now() < deadline && n < 32 {
            match listener.accept() {
                Ok((stream, _)) => {
                    let b = plan.get(n).copied().unwrap_or(Behaviour::Normal);
                    n += 1;
                    let _ = handle(stream, &data, b, &log);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    Server { url, ranges }
}

fn handle(
    stream: TcpStream,
    data: &[u8],
    b: Behaviour,
    log: &Mutex<Vec<Option<String>>>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut range = None;
    for _ in 0..100 {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    log.lock().unwrap().push(range.clone());
    let mut out = stream;
    let start: Option<usize> = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse().ok());
    let (head, body): (String, &[u8]) = match (b, start) {
        (Behaviour::Status(s), _) => (format!("HTTP/1.1 {s} Oops\r\nContent-Length: 0\r\n"), &[]),
        (Behaviour::IgnoreRange, _) | (_, None) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", data.len()),
            data,
        ),
        (_, Some(s)) if s >= data.len() => (
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n".into(),
            &[],
        ),
        (_, Some(s)) => (
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {s}-{}/{}\r\n",
                data.len() - s,
                data.len() - 1,
                data.len()
            ),
            &data[s..],
        ),
    };
    out.write_all(head.as_bytes())?;
    out.write_all(b"Connection: close\r\n\r\n")?;
    let body = match b {
        Behaviour::CutAfter(k) => &body[..k.min(body.len())],
        _ => body,
    };
    out.write_all(body)?;
    out.flush()?;
    out.shutdown(std::net::Shutdown::Both)
}

fn payload(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

fn opts(sha: Option<Sha256Digest>, attempts: u32) -> DownloadOptions {
    DownloadOptions {
        sha256: sha,
        max_attempts: attempts,
        retry_delay: Duration::from_millis(10),
        read_timeout: Duration::from_secs(5),
        progress: false,
    }
}

fn part_of(dest: &Path) -> std::path::PathBuf {
    damascus_hub::http_part_path(dest)
}

#[test]
fn plain_download_with_checksum() {
    let data = payload(200_000);
    let srv = serve(data.clone(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("sub/m.gguf");
    download(
        &srv.url,
        &dest,
        &opts(Some(Sha256Digest::of_bytes(&data)), 3),
    )
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert!(!part_of(&dest).exists());
    assert_eq!(*srv.ranges.lock().unwrap(), vec![None]);
}

#[test]
fn cut_connection_is_resumed_with_a_range_request() {
    let data = payload(300_000);
    let srv = serve(data.clone(), vec![Behaviour::CutAfter(123_456)]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    download(
        &srv.url,
        &dest,
        &opts(Some(Sha256Digest::of_bytes(&data)), 3),
    )
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert_eq!(
        *srv.ranges.lock().unwrap(),
        vec![None, Some("bytes=123456-".to_string())]
    );
}

#[test]
fn interrupted_download_leaves_only_a_part_file_and_resumes_next_run() {
    let data = payload(100_000);
    let srv = serve(data.clone(), vec![Behaviour::CutAfter(40_000)]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    let err = download(&srv.url, &dest, &opts(None, 1)).unwrap_err();
    assert!(
        matches!(err, HubError::Transfer { have: 40_000, .. }),
        "{err}"
    );
    assert!(
        !dest.exists(),
        "a half file must never appear under the final name"
    );
    assert_eq!(std::fs::metadata(part_of(&dest)).unwrap().len(), 40_000);

    // The next run picks up where the first stopped.
    download(
        &srv.url,
        &dest,
        &opts(Some(Sha256Digest::of_bytes(&data)), 1),
    )
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert!(!part_of(&dest).exists());
    assert_eq!(
        *srv.ranges.lock().unwrap(),
        vec![None, Some("bytes=40000-".to_string())]
    );
}

#[test]
fn server_that_ignores_range_still_gives_the_right_file() {
    let data = payload(50_000);
    let srv = serve(
        data.clone(),
        vec![Behaviour::CutAfter(10_000), Behaviour::IgnoreRange],
    );
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    download(
        &srv.url,
        &dest,
        &opts(Some(Sha256Digest::of_bytes(&data)), 3),
    )
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
}

#[test]
fn wrong_checksum_keeps_nothing() {
    let data = payload(10_000);
    let srv = serve(data, vec![]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    let err = download(
        &srv.url,
        &dest,
        &opts(Some(Sha256Digest::of_bytes(b"other")), 2),
    )
    .unwrap_err();
    assert!(matches!(err, HubError::Checksum { .. }), "{err}");
    assert!(!dest.exists());
    assert!(!part_of(&dest).exists());
}

#[test]
fn not_found_fails_at_once_and_server_errors_are_retried() {
    let srv = serve(payload(10), vec![Behaviour::Status(404)]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    let err = download(&srv.url, &dest, &opts(None, 3)).unwrap_err();
    assert!(
        matches!(err, HubError::HttpStatus { status: 404, .. }),
        "{err}"
    );
    assert_eq!(srv.ranges.lock().unwrap().len(), 1);
    assert!(!dest.exists());

    let data = payload(5_000);
    let srv = serve(data.clone(), vec![Behaviour::Status(503)]);
    download(&srv.url, &dest, &opts(None, 3)).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
}

#[test]
fn connection_refused_is_a_one_line_error() {
    // Bind then drop to get a port with (very likely) nobody listening.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m.gguf");
    let err = download(
        &format!("http://127.0.0.1:{port}/m.gguf"),
        &dest,
        &opts(None, 2),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, HubError::Transfer { attempts: 2, .. }),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    assert!(!dest.exists());
}
