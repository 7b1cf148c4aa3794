//! The `video_clip` container: a multipart MJPEG stream.
//!
//! Content type `multipart/x-mixed-replace; boundary=benchlink-frame`, the
//! format browsers and most viewers play as MJPEG. Each part is one JPEG
//! frame:
//!
//! ```text
//! --benchlink-frame\r\n
//! Content-Type: image/jpeg\r\n
//! Content-Length: <bytes>\r\n
//! X-Frame-Index: <0-based>\r\n
//! X-Timestamp-Ms: <ms since the clip's first frame>\r\n
//! X-Captured-At: <RFC 3339>\r\n
//! \r\n
//! <JPEG bytes>\r\n
//! ```
//!
//! and the stream ends with `--benchlink-frame--\r\n`. `Content-Length`
//! makes the parts readable without scanning JPEG data for the boundary.

use chrono::{DateTime, SecondsFormat, Utc};

/// The multipart boundary.
pub const BOUNDARY: &str = "benchlink-frame";

/// The artifact's `content_type`.
pub fn content_type() -> String {
    format!("multipart/x-mixed-replace; boundary={BOUNDARY}")
}

/// One frame of a clip.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipPart {
    /// Milliseconds since the clip's first frame.
    pub timestamp_ms: u64,
    pub captured_at: Option<DateTime<Utc>>,
    pub jpeg: Vec<u8>,
}

/// Write parts (in order) as one multipart MJPEG stream.
pub fn write(parts: &[ClipPart]) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.jpeg.len() + 200).sum();
    let mut out = Vec::with_capacity(total + 32);
    for (i, p) in parts.iter().enumerate() {
        out.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        out.extend_from_slice(b"Content-Type: image/jpeg\r\n");
        out.extend_from_slice(format!("Content-Length: {}\r\n", p.jpeg.len()).as_bytes());
        out.extend_from_slice(format!("X-Frame-Index: {i}\r\n").as_bytes());
        out.extend_from_slice(format!("X-Timestamp-Ms: {}\r\n", p.timestamp_ms).as_bytes());
        if let Some(at) = p.captured_at {
            out.extend_from_slice(
                format!(
                    "X-Captured-At: {}\r\n",
                    at.to_rfc3339_opts(SecondsFormat::Millis, true)
                )
                .as_bytes(),
            );
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&p.jpeg);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    out
}

/// Read a stream written by [`write`]. Errors name the part and the
/// problem (missing header, short body, no closing boundary).
pub fn read(bytes: &[u8]) -> Result<Vec<ClipPart>, String> {
    let open = format!("--{BOUNDARY}\r\n");
    let close = format!("--{BOUNDARY}--");
    let mut pos = 0;
    let mut parts = Vec::new();
    loop {
        let rest = &bytes[pos..];
        if rest.starts_with(close.as_bytes()) {
            return Ok(parts);
        }
        if !rest.starts_with(open.as_bytes()) {
            return Err(format!("part {}: no boundary at byte {pos}", parts.len()));
        }
        pos += open.len();
        let header_end = find(&bytes[pos..], b"\r\n\r\n")
            .ok_or_else(|| format!("part {}: unterminated headers", parts.len()))?;
        let headers = std::str::from_utf8(&bytes[pos..pos + header_end])
            .map_err(|_| format!("part {}: headers are not UTF-8", parts.len()))?;
        pos += header_end + 4;
        let mut length = None;
        let mut timestamp_ms = 0;
        let mut captured_at = None;
        for line in headers.split("\r\n") {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.parse::<usize>().ok(),
                "x-timestamp-ms" => timestamp_ms = v.parse().unwrap_or(0),
                "x-captured-at" => {
                    captured_at = DateTime::parse_from_rfc3339(v)
                        .ok()
                        .map(|t| t.with_timezone(&Utc))
                }
                _ => {}
            }
        }
        let len = length.ok_or_else(|| format!("part {}: no Content-Length", parts.len()))?;
        if bytes.len() < pos + len + 2 {
            return Err(format!(
                "part {}: body shorter than {len} bytes",
                parts.len()
            ));
        }
        parts.push(ClipPart {
            timestamp_ms,
            captured_at,
            jpeg: bytes[pos..pos + len].to_vec(),
        });
        pos += len + 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_survive_a_round_trip_even_when_they_contain_the_boundary() {
        let mut tricky = vec![0xFF, 0xD8];
        tricky.extend_from_slice(format!("--{BOUNDARY}\r\n\r\n").as_bytes());
        tricky.extend_from_slice(&[0xFF, 0xD9]);
        let parts = vec![
            ClipPart {
                timestamp_ms: 0,
                captured_at: Some(Utc::now()),
                jpeg: vec![0xFF, 0xD8, 1, 2, 0xFF, 0xD9],
            },
            ClipPart {
                timestamp_ms: 33,
                captured_at: None,
                jpeg: tricky,
            },
        ];
        let bytes = write(&parts);
        let back = read(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].jpeg, parts[1].jpeg);
        assert_eq!(back[1].timestamp_ms, 33);
        assert!(back[0].captured_at.is_some());
    }

    #[test]
    fn a_cut_stream_is_reported() {
        let bytes = write(&[ClipPart {
            timestamp_ms: 0,
            captured_at: None,
            jpeg: vec![7; 100],
        }]);
        assert!(read(&bytes[..bytes.len() - 60]).is_err());
    }
}
