//! The `command` speech provider (docs/earth-command.md, "Speech"): a local
//! recogniser program, e.g. `pocketsphinx_continuous -infile {input}`, run
//! on the audio converted to a 16 kHz mono 16-bit WAV; its trimmed stdout is
//! the transcript. No network is involved.

use std::io::Cursor;
use std::path::Path;
use std::time::Duration;

/// The sample rate recognisers such as pocketsphinx expect, Hz.
pub const TARGET_RATE_HZ: u32 = 16_000;

/// Half the length of the resampling filter, in samples of the slower of
/// the two rates.
const FILTER_HALF_TAPS: f64 = 16.0;

/// A WAV converted for the recogniser.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    /// A 16 kHz mono 16-bit PCM WAV file.
    pub wav: Vec<u8>,
    /// The audio's length, ms.
    pub duration_ms: u64,
}

/// Decode a WAV (PCM 8/16/24/32-bit or 32-bit float, any rate and channel
/// count), mix its channels down, low-pass and resample it to
/// [`TARGET_RATE_HZ`], and encode it as 16-bit mono WAV.
///
/// Errors: not a WAV (the message says so), no samples.
pub fn to_16k_mono_wav(bytes: &[u8]) -> Result<Converted, String> {
    let reader = hound::WavReader::new(Cursor::new(bytes))
        .map_err(|e| format!("the command provider reads WAV audio only: {e}"))?;
    let spec = reader.spec();
    let channels = usize::from(spec.channels.max(1));
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .into_samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the WAV cannot be read: {e}"))?,
        hound::SampleFormat::Int => {
            let scale = (1i64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            reader
                .into_samples::<i32>()
                .map(|s| s.map(|v| v as f32 / scale))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the WAV cannot be read: {e}"))?
        }
    };
    if samples.len() < channels {
        return Err("the WAV holds no samples".into());
    }
    let mono: Vec<f32> = samples
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() / channels as f32)
        .collect();
    let out = resample(&mono, spec.sample_rate.max(1), TARGET_RATE_HZ);
    let duration_ms = mono.len() as u64 * 1000 / u64::from(spec.sample_rate.max(1));
    let mut wav = Vec::with_capacity(44 + out.len() * 2);
    {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: TARGET_RATE_HZ,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::new(Cursor::new(&mut wav), spec)
            .map_err(|e| format!("cannot write the WAV: {e}"))?;
        for s in &out {
            let v = (s.clamp(-1.0, 1.0) * 32767.0).round() as i16;
            w.write_sample(v)
                .map_err(|e| format!("cannot write the WAV: {e}"))?;
        }
        w.finalize()
            .map_err(|e| format!("cannot write the WAV: {e}"))?;
    }
    Ok(Converted { wav, duration_ms })
}

/// `input` (at `from` Hz) at `to` Hz: band-limited interpolation with a
/// Hann-windowed sinc whose cut-off is the lower rate's Nyquist frequency,
/// so downsampling also low-passes (no aliasing of what the lower rate
/// cannot carry).
pub fn resample(input: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || input.is_empty() {
        return input.to_vec();
    }
    let ratio = f64::from(to) / f64::from(from);
    // Cut-off as a fraction of the input rate (0.5 = input Nyquist).
    let cutoff = 0.5 * ratio.min(1.0);
    let half = FILTER_HALF_TAPS / ratio.min(1.0);
    let n_out = ((input.len() as f64) * ratio).floor() as usize;
    let mut out = Vec::with_capacity(n_out);
    for n in 0..n_out {
        let t = n as f64 / ratio;
        let lo = (t - half).ceil().max(0.0) as usize;
        let hi = ((t + half).floor() as usize).min(input.len() - 1);
        let mut acc = 0.0f64;
        let mut norm = 0.0f64;
        for (k, x) in input.iter().enumerate().take(hi + 1).skip(lo) {
            let d = t - k as f64;
            let arg = 2.0 * cutoff * d;
            let sinc = if arg.abs() < 1e-12 {
                1.0
            } else {
                (std::f64::consts::PI * arg).sin() / (std::f64::consts::PI * arg)
            };
            let w = 0.5 + 0.5 * (std::f64::consts::PI * d / half).cos();
            let c = sinc * w;
            acc += f64::from(*x) * c;
            norm += c;
        }
        out.push(if norm.abs() > 1e-9 {
            (acc / norm) as f32
        } else {
            0.0
        });
    }
    out
}

/// Run `command` on the WAV at `input` ([`crate::program::run`]); its
/// stdout's non-empty lines joined by spaces.
///
/// Errors: see [`crate::program::ProgramError`].
pub async fn run(
    command: &[String],
    input: &Path,
    timeout: Duration,
) -> Result<String, crate::program::ProgramError> {
    let out = crate::program::run(command, input, timeout).await?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav(rate: u32, channels: u16, frames: &[Vec<i16>]) -> Vec<u8> {
        let mut out = Vec::new();
        let spec = hound::WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::new(Cursor::new(&mut out), spec).unwrap();
        for f in frames {
            for s in f {
                w.write_sample(*s).unwrap();
            }
        }
        w.finalize().unwrap();
        out
    }

    fn tone(rate: u32, hz: f64, secs: f64) -> Vec<f32> {
        (0..(f64::from(rate) * secs) as usize)
            .map(|i| {
                (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin() as f32 * 0.5
            })
            .collect()
    }

    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
    }

    #[test]
    fn a_48k_stereo_wav_becomes_16k_mono_of_the_same_length() {
        // Left a 440 Hz tone, right silence: the mix is the tone at half.
        let t = tone(48_000, 440.0, 1.0);
        let frames: Vec<Vec<i16>> = t.iter().map(|s| vec![(s * 32767.0) as i16, 0]).collect();
        let c = to_16k_mono_wav(&wav(48_000, 2, &frames)).unwrap();
        assert_eq!(c.duration_ms, 1000);
        let r = hound::WavReader::new(Cursor::new(&c.wav)).unwrap();
        let spec = r.spec();
        assert_eq!(
            (spec.sample_rate, spec.channels, spec.bits_per_sample),
            (16_000, 1, 16)
        );
        let out: Vec<f32> = r
            .into_samples::<i16>()
            .map(|s| f32::from(s.unwrap()) / 32767.0)
            .collect();
        assert_eq!(out.len(), 16_000);
        // 0.5 amplitude, halved by the mix: RMS 0.25 / sqrt 2.
        let level = rms(&out[1000..15000]);
        assert!((level - 0.25 / 2f64.sqrt()).abs() < 0.01, "{level}");
    }

    #[test]
    fn downsampling_removes_what_the_lower_rate_cannot_carry() {
        // 11 kHz is above 16 kHz's Nyquist (8 kHz): it must not fold back
        // to 5 kHz; 1 kHz passes.
        let high = resample(&tone(48_000, 11_000.0, 0.5), 48_000, 16_000);
        let low = resample(&tone(48_000, 1_000.0, 0.5), 48_000, 16_000);
        assert!(
            rms(&high[200..7800]) < 0.02,
            "aliased: {}",
            rms(&high[200..7800])
        );
        assert!(
            rms(&low[200..7800]) > 0.33,
            "passband: {}",
            rms(&low[200..7800])
        );
    }

    #[test]
    fn other_audio_is_refused_with_a_clear_message() {
        let e = to_16k_mono_wav(b"\x1aE\xdf\xa3webm").unwrap_err();
        assert!(e.contains("WAV audio only"), "{e}");
    }
}
