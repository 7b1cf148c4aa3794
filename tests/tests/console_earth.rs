//! The console's Earth page in real chromium: first against a registry
//! without speech recognition (tests/browser/earth-asr-missing.spec.mjs),
//! then, restarted, sending speech to a stand-in ASR server over HTTP
//! (tests/browser/earth.spec.mjs); chromium's fake capture plays a WAV
//! espeak-ng made. A missing tool (node, chromium, espeak-ng) fails the
//! test under `CI=true`.

use anyhow::{Context, Result};
use benchlink_e2e::asr::FakeAsr;
use benchlink_e2e::bench::{Lab, LabOptions};
use benchlink_e2e::browser::{self, run_spec};
use benchlink_testkit::services::tool_installed;

/// What the stand-in ASR answers (and what the WAV says).
const SPOKEN: &str = "高亮所有北斗卫星";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earth_page_runs_typed_and_spoken_commands_on_the_map() -> Result<()> {
    if !browser::ready() || !tool_installed("espeak-ng") {
        return Ok(());
    }
    let wav = tempfile::Builder::new().suffix(".wav").tempfile()?;
    let out = std::process::Command::new("espeak-ng")
        .args(["-v", "cmn", "-w"])
        .arg(wav.path())
        .arg(SPOKEN)
        .output()
        .context("run espeak-ng")?;
    assert!(out.status.success(), "espeak-ng: {out:?}");

    // First without speech recognition configured: 503, and text works.
    let mut lab = Lab::start(LabOptions::default()).await?;
    run_spec(
        "earth-asr-missing.spec.mjs",
        &[
            ("BENCHLINK_URL", lab.base_url.clone()),
            ("BENCHLINK_TOKEN", lab.admin_token.clone()),
            ("SPEECH_WAV", wav.path().display().to_string()),
        ],
    );

    // Then with the ASR stand-in.
    let asr = FakeAsr::start(SPOKEN).await;
    lab.stop_registry();
    let mut cfg = std::fs::read_to_string(lab.registry_config())?;
    cfg.push_str(&format!(
        "\n[agents.speech]\nenabled = true\nprovider = \"openai_compatible\"\nbase_url = \"{}\"\nmodel = \"whisper-1\"\n",
        asr.base_url
    ));
    std::fs::write(lab.registry_config(), cfg)?;
    lab.start_registry()?;

    run_spec(
        "earth.spec.mjs",
        &[
            ("BENCHLINK_URL", lab.base_url.clone()),
            ("BENCHLINK_TOKEN", lab.admin_token.clone()),
            ("SPEECH_WAV", wav.path().display().to_string()),
            ("SPOKEN_TEXT", SPOKEN.to_string()),
        ],
    );
    // One instruction reached the ASR stand-in: the one recorded after
    // the wake word, nothing while wake listening waited.
    let uploads = asr.uploads();
    assert_eq!(uploads.len(), 1, "uploads: {uploads:?}");
    assert!(uploads[0].body_len > 1000, "an audio body: {uploads:?}");
    Ok(())
}
