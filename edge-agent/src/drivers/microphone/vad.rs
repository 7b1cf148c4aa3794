//! A simple energy voice-activity detector (registered as `supports_vad`).
//!
//! The signal is cut into 20 ms frames; a frame is active when its RMS
//! level is above the threshold: the configured `threshold_dbfs`, raised
//! to 12 dB above the recording's noise floor (its 10th-percentile frame
//! level) in a noisy room. Active frames closer than `hangover_ms` are
//! merged into one segment; segments shorter than `min_segment_ms` are
//! dropped. It detects sound, not speech as such: a tone counts.

use serde::Serialize;

/// Detector knobs.
#[derive(Debug, Clone, Copy)]
pub struct VadConfig {
    /// dBFS; frames at or below never count as active.
    pub threshold_dbfs: f32,
    pub frame_ms: u32,
    pub hangover_ms: u32,
    pub min_segment_ms: u32,
}

impl Default for VadConfig {
    fn default() -> Self {
        Self {
            threshold_dbfs: -40.0,
            frame_ms: 20,
            hangover_ms: 200,
            min_segment_ms: 60,
        }
    }
}

/// One stretch of activity, milliseconds from the start of the audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Segment {
    pub start_ms: u64,
    pub end_ms: u64,
}

/// What the detector found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VadReport {
    /// Active time / total time, 0.0..=1.0.
    pub voice_activity_ratio: f32,
    pub segments: Vec<Segment>,
    /// The threshold actually used, dBFS.
    pub threshold_dbfs: f32,
    /// Level of the whole recording, dBFS (-120 for digital silence).
    pub rms_dbfs: f32,
    /// Loudest sample, dBFS.
    pub peak_dbfs: f32,
    /// 10th-percentile frame level, dBFS.
    pub noise_floor_dbfs: f32,
}

/// dBFS of an RMS or peak amplitude (floor -120).
pub fn dbfs(amplitude: f32) -> f32 {
    if amplitude <= 1e-6 {
        -120.0
    } else {
        (20.0 * amplitude.log10()).max(-120.0)
    }
}

fn rms(x: &[f32]) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    (x.iter().map(|s| s * s).sum::<f32>() / x.len() as f32).sqrt()
}

/// Run the detector over mono samples at `sample_rate` Hz.
pub fn analyze(mono: &[f32], sample_rate: u32, cfg: &VadConfig) -> VadReport {
    let frame_len = (sample_rate as usize * cfg.frame_ms as usize / 1000).max(1);
    let levels: Vec<f32> = mono.chunks(frame_len).map(|f| dbfs(rms(f))).collect();
    let mut sorted = levels.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let noise_floor = sorted.get(sorted.len() / 10).copied().unwrap_or(-120.0);
    let threshold = cfg.threshold_dbfs.max(noise_floor + 12.0);
    let peak = mono.iter().fold(0.0f32, |m, s| m.max(s.abs()));

    let fm = u64::from(cfg.frame_ms);
    let mut segments: Vec<Segment> = Vec::new();
    for (i, level) in levels.iter().enumerate() {
        if *level <= threshold {
            continue;
        }
        let (start, end) = (i as u64 * fm, (i as u64 + 1) * fm);
        match segments.last_mut() {
            Some(last) if start <= last.end_ms + u64::from(cfg.hangover_ms) => last.end_ms = end,
            _ => segments.push(Segment {
                start_ms: start,
                end_ms: end,
            }),
        }
    }
    let total_ms = mono.len() as u64 * 1000 / u64::from(sample_rate.max(1));
    for s in &mut segments {
        s.end_ms = s.end_ms.min(total_ms);
    }
    segments.retain(|s| s.end_ms - s.start_ms >= u64::from(cfg.min_segment_ms));
    let active: u64 = segments.iter().map(|s| s.end_ms - s.start_ms).sum();
    VadReport {
        voice_activity_ratio: if total_ms == 0 {
            0.0
        } else {
            (active as f32 / total_ms as f32).min(1.0)
        },
        segments,
        threshold_dbfs: threshold,
        rms_dbfs: dbfs(rms(mono)),
        peak_dbfs: dbfs(peak),
        noise_floor_dbfs: noise_floor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(ms: u32, rate: u32, amp: f32) -> Vec<f32> {
        (0..rate * ms / 1000)
            .map(|i| amp * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin())
            .collect()
    }

    #[test]
    fn a_burst_between_silences_is_one_segment() {
        let rate = 16_000;
        let mut x = vec![0.0; (rate / 2) as usize];
        x.extend(tone(1000, rate, 0.3));
        x.extend(vec![0.0; (rate / 2) as usize]);
        let r = analyze(&x, rate, &VadConfig::default());
        assert_eq!(r.segments.len(), 1, "{r:?}");
        let s = r.segments[0];
        assert!((480..=520).contains(&s.start_ms), "{s:?}");
        assert!((1480..=1520).contains(&s.end_ms), "{s:?}");
        assert!((r.voice_activity_ratio - 0.5).abs() < 0.03);
    }

    #[test]
    fn silence_has_no_activity_and_short_gaps_are_bridged() {
        let rate = 8_000;
        let r = analyze(&vec![0.0; 8_000], rate, &VadConfig::default());
        assert!(r.segments.is_empty());
        assert_eq!(r.rms_dbfs, -120.0);

        let mut x = tone(300, rate, 0.3);
        x.extend(vec![0.0; 800]); // 100 ms gap < 200 ms hangover
        x.extend(tone(300, rate, 0.3));
        let r = analyze(&x, rate, &VadConfig::default());
        assert_eq!(r.segments.len(), 1);
    }

    #[test]
    fn a_noisy_floor_raises_the_threshold() {
        let rate = 8_000;
        // Constant hum at about -30 dBFS: above the -40 default, but it is
        // the floor, so nothing stands out.
        let x = tone(2000, rate, 0.045);
        let r = analyze(&x, rate, &VadConfig::default());
        assert!(r.threshold_dbfs > -30.0, "{r:?}");
        assert!(r.segments.is_empty(), "{r:?}");
    }
}
