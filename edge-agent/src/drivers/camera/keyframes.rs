//! Keyframe selection: which frames of a stream are worth uploading.
//!
//! Candidates are frames at least `min_interval_ms` apart. Each candidate
//! is reduced to a 32x24 grey thumbnail; a candidate becomes a keyframe
//! when its mean absolute difference from the previous keyframe exceeds
//! `change_threshold` (0.0..=1.0 of full scale). The first frame is always
//! a keyframe. When more than `max_keyframes` qualify, those with the
//! largest changes are kept (in time order).

use image::imageops::FilterType;

use super::frames::decode_jpeg;
use super::ring::StoredFrame;

/// Knobs of [`select`].
#[derive(Debug, Clone, Copy)]
pub struct KeyframeOptions {
    pub max_keyframes: usize,
    /// Fraction of full scale, e.g. 0.08 = 8 % mean grey-level change.
    pub change_threshold: f32,
    pub min_interval_ms: u64,
}

/// A selected keyframe: index into the input, and how much it changed
/// from the previous keyframe (0.0..=1.0; 1.0 for the first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Keyframe {
    pub index: usize,
    pub change: f32,
}

const THUMB_W: u32 = 32;
const THUMB_H: u32 = 24;

/// Choose keyframes among `frames` (time-ordered). Frames that do not
/// decode are skipped.
pub fn select(frames: &[StoredFrame], opts: KeyframeOptions) -> Vec<Keyframe> {
    if frames.is_empty() || opts.max_keyframes == 0 {
        return Vec::new();
    }
    let mut chosen: Vec<Keyframe> = Vec::new();
    let mut last_thumb: Option<Vec<u8>> = None;
    let mut last_candidate_at = None;
    for (i, f) in frames.iter().enumerate() {
        if let Some(t) = last_candidate_at {
            if f.received.duration_since(t).as_millis() < u128::from(opts.min_interval_ms) {
                continue;
            }
        }
        last_candidate_at = Some(f.received);
        let Some(thumb) = thumbnail(&f.jpeg) else {
            continue;
        };
        let change = match &last_thumb {
            None => 1.0,
            Some(prev) => mean_abs_diff(prev, &thumb),
        };
        if last_thumb.is_none() || change > opts.change_threshold {
            chosen.push(Keyframe { index: i, change });
            last_thumb = Some(thumb);
        }
    }
    if chosen.len() > opts.max_keyframes {
        let mut by_change = chosen.clone();
        by_change.sort_by(|a, b| b.change.total_cmp(&a.change));
        by_change.truncate(opts.max_keyframes);
        by_change.sort_by_key(|k| k.index);
        chosen = by_change;
    }
    chosen
}

fn thumbnail(jpeg: &[u8]) -> Option<Vec<u8>> {
    let rgb = decode_jpeg(jpeg).ok()?;
    let grey = image::DynamicImage::ImageRgb8(rgb).to_luma8();
    Some(image::imageops::resize(&grey, THUMB_W, THUMB_H, FilterType::Triangle).into_raw())
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f32 {
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    sum as f32 / (a.len().max(1) as f32 * 255.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::camera::frames::{encode, PixelFormat, StillFormat};
    use std::time::{Duration, Instant};

    fn solid(at: Instant, grey: u8) -> StoredFrame {
        let img = image::RgbImage::from_pixel(64, 48, image::Rgb([grey, grey, grey]));
        StoredFrame {
            received: at,
            captured_at: chrono::Utc::now(),
            jpeg: encode(&img, StillFormat::Jpeg, 90).unwrap(),
            width: 64,
            height: 48,
            source_format: PixelFormat::Mjpeg,
        }
    }

    #[test]
    fn only_scene_changes_become_keyframes() {
        let t0 = Instant::now();
        let greys = [20, 22, 21, 200, 201, 199, 90, 91];
        let frames: Vec<_> = greys
            .iter()
            .enumerate()
            .map(|(i, g)| solid(t0 + Duration::from_millis(i as u64 * 100), *g))
            .collect();
        let opts = KeyframeOptions {
            max_keyframes: 10,
            change_threshold: 0.1,
            min_interval_ms: 0,
        };
        let picked: Vec<usize> = select(&frames, opts).iter().map(|k| k.index).collect();
        assert_eq!(picked, vec![0, 3, 6]);
        let opts = KeyframeOptions {
            max_keyframes: 2,
            ..opts
        };
        let picked: Vec<usize> = select(&frames, opts).iter().map(|k| k.index).collect();
        assert_eq!(picked, vec![0, 3], "the first frame and the largest change");
    }
}
