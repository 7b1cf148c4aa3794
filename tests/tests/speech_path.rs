//! The speech path across real processes and a real audio server: a
//! user-level PulseAudio with a null sink ([`benchlink_testkit::PulseServer`]), an edge with a rodio speaker playing into
//! the sink and a cpal microphone recording its monitor, and a registry
//! whose speech gateway uses the `command` provider with pocketsphinx and
//! the shipped word grammar (config/speech/bench-words.gram). `play_tts`
//! speaks a sentence (espeak-ng) while `record_audio` records; the
//! `transcript` the registry derives from the microphone's clip must hold
//! most of the sentence's words.
//!
//! Without pulseaudio, espeak-ng or pocketsphinx the test skips, except
//! under `CI=true`, where it fails naming what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use benchlink_e2e::bench::{Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::eventually;
use serde_json::{json, Value};

const SPEAKER: &str = "spk-real-01";
const MIC: &str = "mic-real-01";
const SENTENCE: &str = "welcome, how can I help you today";
const CONTENT_WORDS: [&str; 6] = ["welcome", "how", "can", "help", "you", "today"];

fn have(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).output().is_ok()
}

fn grammar() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/speech/bench-words.gram")
}

#[tokio::test]
async fn a_spoken_sentence_recorded_by_the_microphone_is_transcribed_by_the_registry() {
    for (program, arg) in [
        ("espeak-ng", "--version"),
        ("pocketsphinx_continuous", "-h"),
    ] {
        if !have(program, arg) {
            benchlink_testkit::skip_unless_ci(&format!("{program} is not installed"));
            return;
        }
    }
    let pulse = match benchlink_testkit::PulseServer::start() {
        Ok(p) => p,
        Err(why) => {
            benchlink_testkit::skip_unless_ci(&why);
            return;
        }
    };
    let command = json!([
        "pocketsphinx_continuous",
        "-infile",
        "{input}",
        "-jsgf",
        grammar()
            .canonicalize()
            .expect("the shipped grammar")
            .display()
            .to_string(),
        "-wip",
        "1e-2",
        "-logfn",
        "/dev/null"
    ]);
    let lab = Lab::start(LabOptions {
        edge_env: pulse.env(),
        extra_capabilities: vec![
            format!(
                "[[capabilities]]\nid = \"{SPEAKER}\"\ntype = \"speaker\"\n\
                 [capabilities.driver]\nbackend = \"rodio\"\n"
            ),
            format!(
                "[[capabilities]]\nid = \"{MIC}\"\ntype = \"microphone\"\n\
                 [capabilities.driver]\nbackend = \"cpal\"\n"
            ),
        ],
        registry_extra_toml: format!(
            "\n[agents.speech]\nprovider = \"command\"\nlanguage = \"en\"\n\
             timeout_seconds = 60\ncommand = {command}\n"
        ),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let mic = hw.lease_ok(MIC, "speech path").await.expect("mic lease");
    let spk = hw
        .lease_ok(SPEAKER, "speech path")
        .await
        .expect("speaker lease");

    let recording = hw
        .start_action(
            &mic,
            &json!({"action": "record_audio", "params": {"duration_ms": 7000}}),
        )
        .await
        .expect("record_audio starts");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let spoken = hw
        .act_ok(&spk, "play_tts", json!({"text": SENTENCE, "rate": 140}))
        .await
        .expect("play_tts");
    println!("play_tts: {}", spoken["result_summary"]);
    let session = eventually(Duration::from_secs(30), "recording ends", || async {
        let s = hw
            .get_ok(&format!("/api/v1/sessions/{recording}"))
            .await
            .ok()?;
        (s["status"] == "completed").then_some(s)
    })
    .await;
    let clip = session["artifact_refs"][0]
        .as_str()
        .expect("a clip")
        .to_string();
    let transcript = eventually(Duration::from_secs(60), "transcript derived", || async {
        let list = hw
            .get_ok(&format!("/api/v1/artifacts?derived_from={clip}"))
            .await
            .ok()?;
        list["artifacts"]
            .as_array()?
            .iter()
            .find(|a| a["artifact_type"] == "transcript")
            .cloned()
    })
    .await;
    let text = transcript["metadata_json"]["text"]
        .as_str()
        .unwrap()
        .to_lowercase();
    println!("pocketsphinx heard: {text:?}");
    assert_eq!(transcript["metadata_json"]["deriver"], "speech:command");
    assert_eq!(transcript["session_id"], session["session_id"]);
    let body = hw
        .download(transcript["artifact_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&body.bytes).trim().to_lowercase(),
        text
    );
    let heard: Vec<&str> = text.split_whitespace().collect();
    let recalled: Vec<&str> = CONTENT_WORDS
        .iter()
        .copied()
        .filter(|w| heard.contains(w))
        .collect();
    assert!(
        recalled.len() >= 4,
        "only {recalled:?} of {CONTENT_WORDS:?} in {text:?}"
    );
    let _: Value = hw.release(&spk).await.unwrap().1;
    hw.release(&mic).await.unwrap();
}
