//! Device discovery for `edge-agent devices`: what cameras, audio devices
//! and serial ports this bench computer can see, with the names and formats
//! a technician copies into the bench TOML (see `docs/devices.md`).
//!
//! Everything here returns plain serializable data and prints nothing; the
//! CLI decides how to show it. Discovery never panics and never fails as a
//! whole: a subsystem that cannot be listed (no V4L2, no audio server) adds a
//! line to [`DeviceReport::errors`] and the rest is still reported.
//!
//! [`ProbeCache`] also lives here: the media drivers use it to keep their
//! `health()` cheap by re-probing a device at most every few seconds.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait};
use serde::Serialize;

/// Everything `edge-agent devices` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceReport {
    /// V4L2 cameras (nokhwa), with the capture modes each offers.
    pub cameras: Vec<CameraDevice>,
    /// Name of the audio host cpal uses (`PulseAudio` or `ALSA`).
    pub audio_host: String,
    /// Devices that can record (microphone driver `device = ...`). Devices
    /// that list no configuration (ALSA plugins, a `default` with no card
    /// behind it) are left out.
    pub audio_inputs: Vec<AudioDevice>,
    /// Devices that can play (speaker driver `device = ...`).
    pub audio_outputs: Vec<AudioDevice>,
    /// Serial ports (serial, relay, PSU and robot drivers).
    pub serial_ports: Vec<SerialDevice>,
    /// Subsystems that could not be listed, one line each.
    pub errors: Vec<String>,
}

/// One camera as nokhwa's V4L2 backend sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CameraDevice {
    /// V4L2 index: camera driver `device = 0`.
    pub index: u32,
    /// `/dev/video{index}`: also accepted as `device`.
    pub path: String,
    /// Stable `/dev/v4l/by-id/...` links to this node (survive re-plugging;
    /// the best choice for `device`).
    pub by_id: Vec<String>,
    /// Card name, e.g. `HD Pro Webcam C920`: also accepted as `device`.
    pub name: String,
    /// Driver name, e.g. `uvcvideo`.
    pub description: String,
    /// Bus and version, as the driver reports them.
    pub misc: String,
    /// Capture modes, e.g. `{format: "mjpeg", width: 1280, height: 720, fps: 30}`.
    pub formats: Vec<CameraMode>,
    /// Why `formats` is empty when the device could not be opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formats_error: Option<String>,
}

/// One capture mode of a camera.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CameraMode {
    /// `mjpeg`, `yuyv`, `nv12`, `gray`, `rgb` or `bgr` (only MJPEG and YUYV
    /// are used by the camera driver).
    pub format: String,
    pub width: u32,
    pub height: u32,
    /// Frames per second.
    pub fps: u32,
}

/// One audio device as cpal sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AudioDevice {
    /// The identifier to write as `device = "..."` (PulseAudio source/sink
    /// name such as `alsa_input.usb-...` or `vsink.monitor`; ALSA PCM name).
    pub id: String,
    /// Human-readable name, e.g. `Monitor of Null Output` (also accepted).
    pub name: String,
    /// True for the host's default device of that direction.
    pub is_default: bool,
    /// The device's preferred configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_config: Option<AudioConfig>,
    /// What the device accepts, one row per sample format.
    pub supported: Vec<AudioConfigRange>,
}

/// A concrete audio configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AudioConfig {
    /// e.g. `f32`, `i16`, `u16`.
    pub sample_format: String,
    pub channels: u16,
    /// Hz.
    pub sample_rate: u32,
}

/// The configurations a device accepts for one sample format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AudioConfigRange {
    pub sample_format: String,
    /// Fewest channels accepted.
    pub min_channels: u16,
    /// Most channels accepted.
    pub max_channels: u16,
    /// The channel counts accepted, ascending, when not every count from
    /// `min_channels` to `max_channels` is; empty (and left out of the
    /// JSON) when they all are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<u16>,
    /// Hz.
    pub min_sample_rate: u32,
    /// Hz.
    pub max_sample_rate: u32,
}

/// One serial port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SerialDevice {
    /// e.g. `/dev/ttyUSB0`.
    pub port_name: String,
    /// Stable `/dev/serial/by-id/...` links to this port (prefer these in
    /// the bench TOML: `ttyUSB` numbers change when cables are re-plugged).
    pub by_id: Vec<String>,
    /// `usb`, `pci`, `bluetooth` or `unknown`.
    pub port_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usb: Option<UsbIds>,
}

/// USB identity of a serial adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsbIds {
    /// Vendor id, 4 lowercase hex digits (e.g. `0403` for FTDI).
    pub vid: String,
    /// Product id, 4 lowercase hex digits.
    pub pid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
}

/// How long opening one camera to list its formats may take before it is
/// reported as unresponsive.
const CAMERA_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Discover everything. Takes up to a few seconds (each camera is opened
/// briefly to list its formats).
pub fn discover() -> DeviceReport {
    let mut report = DeviceReport::default();
    match discover_cameras() {
        Ok(cams) => report.cameras = cams,
        Err(e) => report.errors.push(format!("cameras: {e}")),
    }
    let audio = discover_audio();
    report.audio_host = audio.host;
    report.audio_inputs = audio.inputs;
    report.audio_outputs = audio.outputs;
    report.errors.extend(audio.errors);
    match discover_serial_ports() {
        Ok(ports) => report.serial_ports = ports,
        Err(e) => report.errors.push(format!("serial ports: {e}")),
    }
    report
}

/// List V4L2 cameras with their capture modes. An empty list is not an
/// error (a bench without a camera).
pub fn discover_cameras() -> Result<Vec<CameraDevice>, String> {
    let infos = nokhwa::query(nokhwa::utils::ApiBackend::Video4Linux).map_err(|e| e.to_string())?;
    let by_id = symlinks_in(Path::new("/dev/v4l/by-id"));
    let mut out = Vec::new();
    for info in infos {
        let Ok(index) = info.index().as_index() else {
            continue;
        };
        let path = format!("/dev/video{index}");
        let (formats, formats_error) = match camera_modes(index) {
            Ok(f) => (f, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        out.push(CameraDevice {
            index,
            by_id: links_to(&by_id, Path::new(&path)),
            path,
            name: info.human_name(),
            description: info.description().to_string(),
            misc: info.misc(),
            formats,
            formats_error,
        });
    }
    Ok(out)
}

/// Open camera `index` on a helper thread (V4L2 calls can block on a
/// wedged device) and list its modes.
fn camera_modes(index: u32) -> Result<Vec<CameraMode>, String> {
    use nokhwa::utils::{CameraIndex, FrameFormat, RequestedFormat, RequestedFormatType};
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("probe-video{index}"))
        .spawn(move || {
            let all = [
                FrameFormat::MJPEG,
                FrameFormat::YUYV,
                FrameFormat::NV12,
                FrameFormat::GRAY,
                FrameFormat::RAWRGB,
                FrameFormat::RAWBGR,
            ];
            let result = nokhwa::Camera::new(
                CameraIndex::Index(index),
                RequestedFormat::with_formats(RequestedFormatType::None, &all),
            )
            .and_then(|mut cam| cam.compatible_camera_formats())
            .map_err(|e| e.to_string());
            let _ = tx.send(result);
        })
        .map_err(|e| e.to_string())?;
    let formats = rx.recv_timeout(CAMERA_OPEN_TIMEOUT).map_err(|_| {
        format!(
            "/dev/video{index} did not answer within {} s",
            CAMERA_OPEN_TIMEOUT.as_secs()
        )
    })??;
    let mut modes: Vec<CameraMode> = formats
        .into_iter()
        .map(|f| CameraMode {
            format: frame_format_name(f.format()).to_string(),
            width: f.width(),
            height: f.height(),
            fps: f.frame_rate(),
        })
        .collect();
    modes.sort();
    modes.dedup();
    Ok(modes)
}

/// Lowercase name of a nokhwa pixel format.
pub(crate) fn frame_format_name(f: nokhwa::utils::FrameFormat) -> &'static str {
    use nokhwa::utils::FrameFormat;
    match f {
        FrameFormat::MJPEG => "mjpeg",
        FrameFormat::YUYV => "yuyv",
        FrameFormat::NV12 => "nv12",
        FrameFormat::GRAY => "gray",
        FrameFormat::RAWRGB => "rgb",
        FrameFormat::RAWBGR => "bgr",
    }
}

/// Audio devices of the default cpal host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AudioDiscovery {
    pub host: String,
    pub inputs: Vec<AudioDevice>,
    pub outputs: Vec<AudioDevice>,
    pub errors: Vec<String>,
}

/// List audio inputs and outputs of cpal's default host (PulseAudio when a
/// server is reachable, ALSA otherwise).
pub fn discover_audio() -> AudioDiscovery {
    let host = cpal::default_host();
    let mut out = AudioDiscovery {
        host: host.id().name().to_string(),
        ..Default::default()
    };
    let default_in = host.default_input_device().and_then(|d| device_id(&d));
    let default_out = host.default_output_device().and_then(|d| device_id(&d));
    let mut saw_null = false;
    match host.input_devices() {
        Ok(devs) => {
            let devs: Vec<cpal::Device> = devs.collect();
            saw_null |= devs.iter().any(is_null_device);
            out.inputs.extend(
                devs.iter()
                    .filter(|d| !is_null_device(d))
                    .map(|d| describe_audio(d, true, default_in.as_deref()))
                    .filter(|d| !d.supported.is_empty()),
            );
        }
        Err(e) => out.errors.push(format!("audio inputs: {e}")),
    }
    match host.output_devices() {
        Ok(devs) => {
            let devs: Vec<cpal::Device> = devs.collect();
            saw_null |= devs.iter().any(is_null_device);
            out.outputs.extend(
                devs.iter()
                    .filter(|d| !is_null_device(d))
                    .map(|d| describe_audio(d, false, default_out.as_deref()))
                    .filter(|d| !d.supported.is_empty()),
            );
        }
        Err(e) => out.errors.push(format!("audio outputs: {e}")),
    }
    if out.inputs.is_empty() && out.outputs.is_empty() && out.errors.is_empty() {
        out.errors.push(format!(
            "audio: {} offers no usable device{} (no sound card, and no PulseAudio server reachable)",
            out.host,
            if saw_null { ", only its `null` device" } else { "" }
        ));
    }
    out
}

/// The identifier of a cpal device (PulseAudio name, ALSA PCM name).
pub(crate) fn device_id(d: &cpal::Device) -> Option<String> {
    d.id().ok().map(|id| id.id().to_string())
}

/// The human-readable name of a cpal device.
pub(crate) fn device_name(d: &cpal::Device) -> String {
    d.description()
        .map(|desc| desc.name().to_string())
        .unwrap_or_else(|_| device_id(d).unwrap_or_default())
}

/// True for ALSA's `null` PCM: it accepts and produces silence, so it is
/// never a real microphone or speaker.
pub(crate) fn is_null_device(d: &cpal::Device) -> bool {
    let driver_null = d
        .description()
        .map(|desc| desc.driver() == Some("null"))
        .unwrap_or(false);
    driver_null || device_id(d).as_deref() == Some("null")
}

fn describe_audio(d: &cpal::Device, input: bool, default_id: Option<&str>) -> AudioDevice {
    let id = device_id(d).unwrap_or_default();
    let default_config = if input {
        d.default_input_config()
    } else {
        d.default_output_config()
    }
    .ok()
    .map(|c| AudioConfig {
        sample_format: c.sample_format().to_string(),
        channels: c.channels(),
        sample_rate: c.sample_rate(),
    });
    let ranges: Vec<(String, u16, u32, u32)> = if input {
        d.supported_input_configs()
            .map(|it| {
                it.map(|r| {
                    (
                        r.sample_format().to_string(),
                        r.channels(),
                        r.min_sample_rate(),
                        r.max_sample_rate(),
                    )
                })
                .collect()
            })
            .unwrap_or_default()
    } else {
        d.supported_output_configs()
            .map(|it| {
                it.map(|r| {
                    (
                        r.sample_format().to_string(),
                        r.channels(),
                        r.min_sample_rate(),
                        r.max_sample_rate(),
                    )
                })
                .collect()
            })
            .unwrap_or_default()
    };
    AudioDevice {
        is_default: default_id == Some(id.as_str()),
        name: device_name(d),
        id,
        default_config,
        supported: summarize_ranges(&ranges),
    }
}

/// Find the audio device a driver's `device` setting names on `host`:
/// `default` (or empty) means the host's default device of that direction;
/// anything else matches a device id or name exactly, then a unique
/// case-insensitive substring. ALSA's `null` device never counts as a
/// default (a machine with no sound card has only that). Errors start with
/// `no audio input device` / `no audio output device`.
pub fn find_audio_device(
    host: &cpal::Host,
    name: &str,
    input: bool,
) -> Result<cpal::Device, String> {
    let dir = if input { "input" } else { "output" };
    let host_name = host.id().name();
    if name.is_empty() || name == "default" {
        let d = if input {
            host.default_input_device()
        } else {
            host.default_output_device()
        }
        .ok_or_else(|| {
            format!("no audio {dir} device: the {host_name} host has no default {dir}")
        })?;
        if is_null_device(&d) {
            return Err(format!(
                "no audio {dir} device: {host_name} offers only its null device (no sound card and no audio server)"
            ));
        }
        return usable(&d, input).map(|_| d).map_err(|e| {
            format!(
                "no audio {dir} device: {host_name}'s default {dir} is not usable ({e}); no sound card and no audio server?"
            )
        });
    }
    let devices: Vec<cpal::Device> = if input {
        host.input_devices().map(|d| d.collect())
    } else {
        host.output_devices().map(|d| d.collect())
    }
    .map_err(|e| {
        format!("no audio {dir} device named \"{name}\": cannot list {host_name} devices: {e}")
    })?;
    if let Some(d) = devices
        .iter()
        .find(|d| device_id(d).as_deref() == Some(name) || device_name(d) == name)
    {
        return usable(d, input)
            .map(|_| d.clone())
            .map_err(|e| format!("no audio {dir} device named \"{name}\" is usable: {e}"));
    }
    let lower = name.to_lowercase();
    let partial: Vec<&cpal::Device> = devices
        .iter()
        .filter(|d| {
            device_id(d)
                .unwrap_or_default()
                .to_lowercase()
                .contains(&lower)
                || device_name(d).to_lowercase().contains(&lower)
        })
        .collect();
    if partial.len() == 1 {
        return usable(partial[0], input)
            .map(|_| partial[0].clone())
            .map_err(|e| format!("no audio {dir} device named \"{name}\" is usable: {e}"));
    }
    let known: Vec<String> = devices.iter().filter_map(device_id).collect();
    Err(format!(
        "no audio {dir} device named \"{name}\" on {host_name} ({}: {})",
        if partial.len() > 1 {
            "ambiguous; candidates"
        } else {
            "present"
        },
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    ))
}

/// A device is usable when it lists at least one configuration for the
/// direction (ALSA's `default` on a machine without a card lists none).
fn usable(d: &cpal::Device, input: bool) -> Result<(), String> {
    let count = if input {
        d.supported_input_configs().map(|c| c.count())
    } else {
        d.supported_output_configs().map(|c| c.count())
    }
    .map_err(|e| e.to_string())?;
    if count == 0 {
        return Err(format!(
            "it has no {} configurations",
            if input { "input" } else { "output" }
        ));
    }
    Ok(())
}

/// Fold cpal's one-row-per-(format, channels) ranges into one row per
/// sample format: `(sample_format, channels, min_rate, max_rate)` in.
pub fn summarize_ranges(ranges: &[(String, u16, u32, u32)]) -> Vec<AudioConfigRange> {
    let mut out: Vec<AudioConfigRange> = Vec::new();
    for (fmt, ch, min, max) in ranges {
        match out.iter_mut().find(|r| &r.sample_format == fmt) {
            Some(r) => {
                if !r.channels.contains(ch) {
                    r.channels.push(*ch);
                    r.channels.sort_unstable();
                }
                r.min_sample_rate = r.min_sample_rate.min(*min);
                r.max_sample_rate = r.max_sample_rate.max(*max);
            }
            None => out.push(AudioConfigRange {
                sample_format: fmt.clone(),
                min_channels: *ch,
                max_channels: *ch,
                channels: vec![*ch],
                min_sample_rate: *min,
                max_sample_rate: *max,
            }),
        }
    }
    for r in &mut out {
        r.min_channels = r.channels.first().copied().unwrap_or(0);
        r.max_channels = r.channels.last().copied().unwrap_or(0);
        let every = usize::from(r.max_channels - r.min_channels) + 1;
        if r.channels.len() == every {
            r.channels.clear();
        }
    }
    out
}

/// Runs `f` with file descriptor 2 pointed at `/dev/null`, so that what
/// audio libraries print there while devices are probed (ALSA's
/// `ALSA lib confmisc.c:...` lines, JACK's `jack server is not running`)
/// stays out of a command's output. Process-wide: for one-shot commands
/// such as `edge-agent devices`, never inside the daemon. Runs `f`
/// unsilenced when `/dev/null` cannot be opened.
pub fn with_stderr_silenced<T>(f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return f();
    };
    // SAFETY: plain descriptor calls on fd 2 and descriptors we own.
    let saved = unsafe { libc::dup(2) };
    if saved < 0 || unsafe { libc::dup2(null.as_raw_fd(), 2) } < 0 {
        if saved >= 0 {
            unsafe { libc::close(saved) };
        }
        return f();
    }
    let out = f();
    // SAFETY: `saved` is the duplicate of the original fd 2 made above.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    out
}

/// List serial ports with their stable by-id names and USB identity.
pub fn discover_serial_ports() -> Result<Vec<SerialDevice>, String> {
    let ports = serialport::available_ports().map_err(|e| e.to_string())?;
    let by_id = symlinks_in(Path::new("/dev/serial/by-id"));
    Ok(ports
        .into_iter()
        .map(|p| {
            let (port_type, usb) = match p.port_type {
                serialport::SerialPortType::UsbPort(u) => (
                    "usb",
                    Some(UsbIds {
                        vid: format!("{:04x}", u.vid),
                        pid: format!("{:04x}", u.pid),
                        serial_number: u.serial_number,
                        manufacturer: u.manufacturer,
                        product: u.product,
                    }),
                ),
                serialport::SerialPortType::PciPort => ("pci", None),
                serialport::SerialPortType::BluetoothPort => ("bluetooth", None),
                serialport::SerialPortType::Unknown => ("unknown", None),
            };
            SerialDevice {
                by_id: links_to(&by_id, Path::new(&p.port_name)),
                port_name: p.port_name,
                port_type: port_type.to_string(),
                usb,
            }
        })
        .collect())
}

/// `(link path, resolved target)` for every symlink in `dir` (empty when
/// the directory does not exist).
pub fn symlinks_in(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let link = e.path();
            let target = std::fs::canonicalize(&link).ok()?;
            Some((link, target))
        })
        .collect();
    out.sort();
    out
}

/// The links (from [`symlinks_in`]) whose target is `node`, as strings.
pub fn links_to(links: &[(PathBuf, PathBuf)], node: &Path) -> Vec<String> {
    let node = std::fs::canonicalize(node).unwrap_or_else(|_| node.to_path_buf());
    links
        .iter()
        .filter(|(_, target)| *target == node)
        .map(|(link, _)| link.display().to_string())
        .collect()
}

/// A device probe result remembered for `ttl`, so `health()` (called for
/// every heartbeat) does not re-open a device or re-query the audio server
/// each time.
#[derive(Debug)]
pub struct ProbeCache {
    ttl: Duration,
    last: Option<(Instant, Result<(), String>)>,
}

impl ProbeCache {
    /// A cache that keeps a result for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, last: None }
    }

    /// The cached result if younger than the TTL, else `probe()`'s (cached).
    pub fn get(&mut self, probe: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
        if let Some((at, result)) = &self.last {
            if at.elapsed() < self.ttl {
                return result.clone();
            }
        }
        let result = probe();
        self.last = Some((Instant::now(), result.clone()));
        result
    }

    /// Forget the cached result (after a device error, or once a device
    /// worked again).
    pub fn invalidate(&mut self) {
        self.last = None;
    }
}

/// How long the media drivers keep a device probe result.
pub const HEALTH_PROBE_TTL: Duration = Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_fold_into_one_row_per_sample_format() {
        let rows = vec![
            ("f32".to_string(), 1, 8000, 48000),
            ("f32".to_string(), 2, 8000, 96000),
            ("i16".to_string(), 2, 44100, 44100),
        ];
        let s = summarize_ranges(&rows);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].min_channels, s[0].max_channels), (1, 2));
        assert!(s[0].channels.is_empty(), "1..=2 all accepted: no list");
        assert_eq!((s[0].min_sample_rate, s[0].max_sample_rate), (8000, 96000));
        assert_eq!(s[1].sample_format, "i16");
    }

    #[test]
    fn channel_counts_with_gaps_are_listed() {
        let rows = vec![
            ("i16".to_string(), 1, 8000, 48000),
            ("i16".to_string(), 2, 8000, 48000),
            ("i16".to_string(), 6, 8000, 48000),
        ];
        let s = summarize_ranges(&rows);
        assert_eq!((s[0].min_channels, s[0].max_channels), (1, 6));
        assert_eq!(s[0].channels, vec![1, 2, 6]);
    }

    #[test]
    fn by_id_links_are_matched_to_their_node() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("ttyUSB0");
        std::fs::write(&node, b"").unwrap();
        let links = dir.path().join("by-id");
        std::fs::create_dir(&links).unwrap();
        std::os::unix::fs::symlink(&node, links.join("usb-FTDI_FT232R-if00-port0")).unwrap();
        let found = symlinks_in(&links);
        assert_eq!(found.len(), 1);
        let names = links_to(&found, &node);
        assert_eq!(names.len(), 1);
        assert!(names[0].ends_with("usb-FTDI_FT232R-if00-port0"));
        assert!(links_to(&found, &dir.path().join("ttyUSB1")).is_empty());
    }

    #[test]
    fn probe_cache_reuses_a_result_until_the_ttl_passes() {
        let mut cache = ProbeCache::new(Duration::from_millis(50));
        let mut calls = 0;
        for _ in 0..3 {
            let _ = cache.get(|| {
                calls += 1;
                Err("gone".into())
            });
        }
        assert_eq!(calls, 1);
        std::thread::sleep(Duration::from_millis(60));
        let r = cache.get(|| {
            calls += 1;
            Ok(())
        });
        assert_eq!(calls, 2);
        assert!(r.is_ok());
    }
}
