//! WAV evidence: captured samples (any device format, converted to `f32`
//! on arrival) written as 16-bit PCM WAV with hound.

use std::io::Cursor;

use crate::drivers::DriverError;

/// `f32` in -1.0..=1.0 to `i16`, clamped and rounded.
pub fn f32_to_i16(x: f32) -> i16 {
    let x = if x.is_finite() {
        x.clamp(-1.0, 1.0)
    } else {
        0.0
    };
    (x * 32767.0).round() as i16
}

/// Encode interleaved samples as a 16-bit PCM WAV file.
pub fn encode_i16(
    interleaved: &[f32],
    channels: u16,
    sample_rate: u32,
) -> Result<Vec<u8>, DriverError> {
    let spec = hound::WavSpec {
        channels,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = Cursor::new(Vec::with_capacity(44 + interleaved.len() * 2));
    let mut write = || -> Result<(), hound::Error> {
        let mut w = hound::WavWriter::new(&mut out, spec)?;
        for s in interleaved {
            w.write_sample(f32_to_i16(*s))?;
        }
        w.finalize()
    };
    write().map_err(|e| DriverError::Device(format!("writing WAV failed: {e}")))?;
    Ok(out.into_inner())
}

/// A decoded WAV file: interleaved samples as `f32`.
#[derive(Debug, Clone)]
pub struct Pcm {
    pub samples: Vec<f32>,
    pub channels: u16,
    /// Hz.
    pub sample_rate: u32,
}

impl Pcm {
    /// Frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels.max(1))
    }
    /// Length in milliseconds.
    pub fn duration_ms(&self) -> u64 {
        self.frames() as u64 * 1000 / u64::from(self.sample_rate.max(1))
    }
    /// Channels averaged to one.
    pub fn mono(&self) -> Vec<f32> {
        to_mono(&self.samples, self.channels)
    }
}

/// Decode a WAV file (integer or float PCM).
pub fn decode(bytes: &[u8]) -> Result<Pcm, String> {
    let mut r = hound::WavReader::new(Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let spec = r.spec();
    let samples: Result<Vec<f32>, hound::Error> = match spec.sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().collect(),
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1i64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            r.samples::<i32>()
                .map(|s| s.map(|v| v as f32 * scale))
                .collect()
        }
    };
    Ok(Pcm {
        samples: samples.map_err(|e| e.to_string())?,
        channels: spec.channels,
        sample_rate: spec.sample_rate,
    })
}

/// Average interleaved channels to mono.
pub fn to_mono(interleaved: &[f32], channels: u16) -> Vec<f32> {
    let ch = usize::from(channels.max(1));
    if ch == 1 {
        return interleaved.to_vec();
    }
    interleaved
        .chunks_exact(ch)
        .map(|f| f.iter().sum::<f32>() / ch as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_survive_a_wav_round_trip() {
        let samples: Vec<f32> = (0..480).map(|i| ((i as f32) / 10.0).sin() * 0.5).collect();
        let bytes = encode_i16(&samples, 2, 48_000).unwrap();
        let pcm = decode(&bytes).unwrap();
        assert_eq!((pcm.channels, pcm.sample_rate), (2, 48_000));
        assert_eq!(pcm.frames(), 240);
        assert_eq!(pcm.duration_ms(), 5);
        for (a, b) in samples.iter().zip(&pcm.samples) {
            assert!((a - b).abs() < 1e-3);
        }
    }

    #[test]
    fn out_of_range_and_nan_samples_are_clamped() {
        assert_eq!(f32_to_i16(2.0), 32767);
        assert_eq!(f32_to_i16(-2.0), -32767);
        assert_eq!(f32_to_i16(f32::NAN), 0);
    }
}
