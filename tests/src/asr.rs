//! A stand-in speech recognition server for the console's tests: it speaks
//! the OpenAI transcription wire format (`POST /v1/audio/transcriptions`,
//! multipart in, `verbose_json` out) over real HTTP on a loopback port and
//! answers every upload with one configured text. [`FakeAsr::uploads`]
//! tells what reached it (the audio's size and content type), so a test
//! can check that nothing was uploaded.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One upload as the server saw it.
#[derive(Debug, Clone)]
pub struct Upload {
    /// Bytes of the whole multipart body.
    pub body_len: usize,
    /// The request's `Content-Type` (`multipart/form-data; boundary=…`).
    pub content_type: String,
}

/// The running server; it lives until the test's runtime ends.
pub struct FakeAsr {
    /// `http://127.0.0.1:PORT/v1`, the registry's `agents.speech.base_url`.
    pub base_url: String,
    uploads: Arc<Mutex<Vec<Upload>>>,
}

impl FakeAsr {
    /// Listen on a free loopback port; every transcription answers `text`.
    pub async fn start(text: &str) -> FakeAsr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the ASR stand-in");
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let uploads: Arc<Mutex<Vec<Upload>>> = Arc::default();
        let seen = uploads.clone();
        let text = text.to_string();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let seen = seen.clone();
                let text = text.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 16384];
                    let (head_end, len) = loop {
                        let Ok(n) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            let len = header(&head, "content-length")
                                .and_then(|v| v.parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break (end, len);
                            }
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let ok = head.starts_with("POST ") && head.contains("/audio/transcriptions");
                    let (status, body) = if ok {
                        seen.lock().unwrap().push(Upload {
                            body_len: len,
                            content_type: header(&head, "content-type").unwrap_or_default(),
                        });
                        let body = json!({
                            "task": "transcribe", "language": "zh", "duration": 2.1, "text": text,
                            "segments": [{"id": 0, "start": 0.0, "end": 2.1, "text": text, "avg_logprob": -0.1}]
                        });
                        ("200 OK", body.to_string())
                    } else {
                        (
                            "404 Not Found",
                            json!({"error": {"message": "not found"}}).to_string(),
                        )
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        FakeAsr { base_url, uploads }
    }

    /// Every upload so far.
    pub fn uploads(&self) -> Vec<Upload> {
        self.uploads.lock().unwrap().clone()
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}
