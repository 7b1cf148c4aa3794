//! The `benchlink` CLI against a real lab (registry + simulated bench):
//! a group lease of the camera and the serial console, actions on both,
//! an artifact download checked against the bench's sha256, release; the
//! conflict exit code for a capability someone else holds; `watch`
//! showing a preemption as it happens; maintenance of a capability and of
//! the whole bench, and removing a retired capability. Every command runs
//! with `--json` and its stdout must parse.

use std::process::Stdio;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::workspace_bin;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What one `benchlink` run gave.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout as JSON; panics with both streams when it does not parse.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// A `benchlink` command for `lab` with `token`, isolated from the
/// user's config file.
fn command(lab: &Lab, token: &str, cfg_home: &std::path::Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(workspace_bin("benchlink"));
    c.env("BENCHLINK_URL", &lab.base_url)
        .env("BENCHLINK_TOKEN", token)
        .env_remove("BENCHLINK_CONFIG")
        .env_remove("BENCHLINK_TOKEN_FILE")
        .env("XDG_CONFIG_HOME", cfg_home)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

async fn bl(lab: &Lab, token: &str, cfg: &std::path::Path, args: &[&str]) -> Run {
    let out = command(lab, token, cfg)
        .args(args)
        .output()
        .await
        .expect("run benchlink");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `bl` that must exit 0; returns its JSON stdout.
async fn ok(lab: &Lab, token: &str, cfg: &std::path::Path, args: &[&str]) -> Value {
    let r = bl(lab, token, cfg, args).await;
    assert_eq!(
        r.code, 0,
        "benchlink {args:?} exited {}:\nstdout: {}\nstderr: {}",
        r.code, r.stdout, r.stderr
    );
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_lease_act_download_release_and_a_refused_second_holder() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let cfg = tempfile::tempdir().unwrap();
    let hw = lab.hw_token.clone();
    let c = cfg.path();

    let listed = ok(&lab, &hw, c, &["--json", "caps", "--type", "camera"]).await;
    let ids: Vec<&str> = listed["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["capability_id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [caps::CAMERA],
        "caps --type camera lists the camera only"
    );

    // The camera and the serial console as one group.
    let group = ok(
        &lab,
        &hw,
        c,
        &[
            "--json",
            "lease",
            caps::CAMERA,
            caps::CONSOLE,
            "--duration",
            "120",
            "--wait",
            "10",
            "--purpose",
            "cli check",
        ],
    )
    .await;
    assert_eq!(group["status"], "granted", "{group}");
    let lease_of = |cap: &str| -> String {
        group["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["capability_id"] == cap)
            .and_then(|l| l["lease_id"].as_str())
            .unwrap_or_else(|| panic!("no lease of {cap} in {group}"))
            .to_string()
    };
    let (cam_lease, con_lease) = (lease_of(caps::CAMERA), lease_of(caps::CONSOLE));

    let who = ok(&lab, &hw, c, &["--json", "who"]).await;
    let held: Vec<&str> = who["held"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["holder_ref"] == HW_AGENT)
        .filter_map(|l| l["capability_id"].as_str())
        .collect();
    assert!(
        held.contains(&caps::CAMERA) && held.contains(&caps::CONSOLE),
        "{who}"
    );

    // A second principal is refused the held camera: exit 5, a message
    // naming the holder, and no queued request left behind.
    let refused = bl(&lab, &lab.chief_token, c, &["lease", caps::CAMERA]).await;
    assert_eq!(refused.code, 5, "stderr: {}", refused.stderr);
    assert!(
        refused.stderr.contains("held by") && refused.stderr.contains(HW_AGENT),
        "stderr names the holder: {}",
        refused.stderr
    );
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let queued = chief
        .get_ok(&format!(
            "/api/v1/capability-leases?principal={CHIEF_AGENT}&status=requested"
        ))
        .await
        .unwrap();
    assert_eq!(
        queued["leases"].as_array().map(Vec::len),
        Some(0),
        "{queued}"
    );
    let refused_json = bl(
        &lab,
        &lab.chief_token,
        c,
        &["--json", "lease", caps::CAMERA],
    )
    .await;
    assert_eq!(refused_json.code, 5);
    let answer = refused_json.json();
    assert_eq!(answer["error"]["exit_code"], 5);
    // The answer is the withdrawn request as it ended, not the queued one.
    assert_eq!(answer["error"]["answer"]["status"], "released", "{answer}");

    // Serial console: open, write a line, read.
    let s = ok(&lab, &hw, c, &["--json", "act", &con_lease, "open"]).await;
    assert_eq!(s["status"], "completed", "{s}");
    let s = ok(
        &lab,
        &hw,
        c,
        &[
            "--json",
            "act",
            &con_lease,
            "write",
            "text=help",
            "line_ending=lf",
        ],
    )
    .await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        s["input_summary"]["text"], "help",
        "key=value reached the bench: {s}"
    );
    let s = ok(
        &lab,
        &hw,
        c,
        &["--json", "act", &con_lease, "read", "timeout_ms=500"],
    )
    .await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        s["input_summary"]["timeout_ms"], 500,
        "a number stays a number: {s}"
    );

    // Camera snapshot, then the artifact to a file, checked.
    let snap = ok(&lab, &hw, c, &["--json", "act", &cam_lease, "snapshot"]).await;
    assert_eq!(snap["status"], "completed", "{snap}");
    let art = snap["artifact_refs"][0]
        .as_str()
        .expect("an artifact")
        .to_string();
    let hw_agent = Agent::new(&lab.base_url, HW_AGENT, &hw);
    hw_agent
        .wait_artifacts_uploaded(std::slice::from_ref(&cam_lease), Duration::from_secs(20))
        .await
        .unwrap();
    let meta = ok(
        &lab,
        &hw,
        c,
        &[
            "--json",
            "artifact",
            "list",
            "--session",
            snap["session_id"].as_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(meta["artifacts"][0]["artifact_id"], art.as_str());
    let out = cfg.path().join("snapshot.jpg");
    let got = ok(
        &lab,
        &hw,
        c,
        &[
            "--json",
            "artifact",
            "get",
            &art,
            "-o",
            out.to_str().unwrap(),
        ],
    )
    .await;
    let edge_sum = meta["artifacts"][0]["checksum"].as_str().unwrap();
    let bytes = std::fs::read(&out).expect("the file was written");
    assert!(!bytes.is_empty());
    assert_eq!(
        sha256_hex(&bytes),
        edge_sum,
        "the file hashes to the edge's checksum"
    );
    assert_eq!(got["sha256"], edge_sum);
    assert_eq!(got["verified"], true);

    let session = ok(
        &lab,
        &hw,
        c,
        &["--json", "session", snap["session_id"].as_str().unwrap()],
    )
    .await;
    assert_eq!(session["artifact_refs"][0], art.as_str());

    // Renew, then release both.
    let renewed = ok(
        &lab,
        &hw,
        c,
        &["--json", "renew", &cam_lease, "--duration", "60"],
    )
    .await;
    assert_eq!(renewed["lease_id"], cam_lease.as_str());
    for l in [&cam_lease, &con_lease] {
        let r = ok(&lab, &hw, c, &["--json", "release", l]).await;
        assert_eq!(r["status"], "released", "{r}");
    }
    let who = ok(&lab, &hw, c, &["--json", "who"]).await;
    assert!(
        who["held"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["holder_ref"] != HW_AGENT),
        "nothing held after release: {who}"
    );

    // Now the camera is free, the second principal gets it.
    let l = ok(
        &lab,
        &lab.chief_token,
        c,
        &["--json", "lease", caps::CAMERA],
    )
    .await;
    assert_eq!(l["status"], "granted", "{l}");

    // Acting on someone else's lease: refused, exit 3.
    let r = bl(
        &lab,
        &hw,
        c,
        &["act", l["lease_id"].as_str().unwrap(), "snapshot"],
    )
    .await;
    assert_eq!(r.code, 3, "stderr: {}", r.stderr);
    assert!(r.stderr.contains("not_lease_holder"), "{}", r.stderr);

    // An unknown session: 4; a bad parameter: 2.
    let r = bl(&lab, &hw, c, &["session", "sess-nope"]).await;
    assert_eq!(r.code, 4, "stderr: {}", r.stderr);
    let r = bl(&lab, &hw, c, &["act", "x", "snapshot", "novalue"]).await;
    assert_eq!(r.code, 2, "stderr: {}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_a_preemption_as_it_happens() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let cfg = tempfile::tempdir().unwrap();
    let c = cfg.path();

    let mut watch = command(&lab, &lab.admin_token, c)
        .args([
            "--json",
            "watch",
            "--after",
            "0",
            "--capability",
            caps::ROBOT,
            "--types",
            "lease_granted,lease_preempt_requested,lease_preempted",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The stream is open once the first grant shows up on it.
    let first = ok(
        &lab,
        &lab.hw_token,
        c,
        &["--json", "lease", caps::ROBOT, "--priority", "40"],
    )
    .await;
    let held = first["lease_id"].as_str().unwrap().to_string();
    let mut seen: Vec<Value> = Vec::new();
    let read_until = |pred: &dyn Fn(&Value) -> bool, seen: &Vec<Value>| seen.iter().any(pred);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !read_until(
        &|e| e["event_type"] == "lease_granted" && e["lease_id"] == held.as_str(),
        &seen,
    ) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("watch printed the grant in time")
            .unwrap()
            .expect("watch still running");
        seen.push(serde_json::from_str(&line).expect("each watch line is JSON"));
    }

    let pre = ok(
        &lab,
        &lab.chief_token,
        c,
        &[
            "--json",
            "lease",
            caps::ROBOT,
            "--priority",
            "80",
            "--preempt-reason",
            "chief_audit",
            "--wait",
            "30",
        ],
    )
    .await;
    assert_eq!(
        pre["status"], "granted",
        "the chief gets the robot after the grace period: {pre}"
    );
    while !read_until(
        &|e| e["event_type"] == "lease_preempted" && e["lease_id"] == held.as_str(),
        &seen,
    ) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("watch printed the preemption in time")
            .unwrap()
            .expect("watch still running");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    let types: Vec<&str> = seen
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .collect();
    let at = |t: &str| types.iter().position(|x| *x == t).unwrap();
    assert!(
        at("lease_preempt_requested") < at("lease_preempted"),
        "{types:?}"
    );
    assert!(
        seen.iter().all(|e| e["capability_id"] == caps::ROBOT),
        "the --capability filter holds: {seen:?}"
    );
    let notice = seen
        .iter()
        .find(|e| e["event_type"] == "lease_preempt_requested")
        .unwrap();
    assert_eq!(notice["lease_id"], held.as_str());
    assert_eq!(
        notice["data"]["notice"]["preempt_reason"], "chief_audit",
        "{notice}"
    );
    let _ = watch.kill().await;

    // The preempted holder's next action is refused: a conflict (5).
    let r = bl(
        &lab,
        &lab.hw_token,
        c,
        &["act", &held, "tap", "x_mm=35.0", "y_mm=70.0"],
    )
    .await;
    assert_eq!(r.code, 5, "stderr {}", r.stderr);
    assert!(r.stderr.contains("lease_not_usable"), "{}", r.stderr);
}

/// The `status` of `capability_id` in `benchlink --json caps`, `None`
/// when it is not listed.
async fn listed_status(lab: &Lab, cfg: &std::path::Path, capability_id: &str) -> Option<String> {
    let listed = ok(lab, &lab.admin_token, cfg, &["--json", "caps"]).await;
    listed["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["capability_id"] == capability_id)
        .map(|c| c["status"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_start_end_and_removing_a_retired_capability() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let cfg = tempfile::tempdir().unwrap();
    let c = cfg.path();
    let admin = lab.admin_token.clone();

    // A held camera into maintenance: the line names it, the reason and
    // the holder told to give way.
    let hw_agent = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let held = hw_agent
        .lease_ok(caps::CAMERA, "cli maintenance")
        .await
        .unwrap();
    let r = bl(
        &lab,
        &admin,
        c,
        &[
            "maintenance",
            "start",
            caps::CAMERA,
            "--reason",
            "lens swap",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        format!(
            "{} is in maintenance (lens swap); 1 holder told to give way: {held}",
            caps::CAMERA
        ),
        "stderr: {}",
        r.stderr
    );
    assert_eq!(
        listed_status(&lab, c, caps::CAMERA).await.as_deref(),
        Some("maintenance")
    );
    hw_agent.release(&held).await.unwrap();
    let ended = ok(
        &lab,
        &admin,
        c,
        &["--json", "maintenance", "end", caps::CAMERA],
    )
    .await;
    assert_eq!(ended["capabilities"][0]["status"], "available", "{ended}");
    assert_eq!(
        listed_status(&lab, c, caps::CAMERA).await.as_deref(),
        Some("available")
    );

    // The same with --json and no holder; the human end line.
    let started = ok(
        &lab,
        &admin,
        c,
        &[
            "--json",
            "maintenance",
            "start",
            caps::SCREEN,
            "--reason",
            "recalibration",
        ],
    )
    .await;
    assert_eq!(
        started["capabilities"][0]["status"], "maintenance",
        "{started}"
    );
    assert_eq!(
        started["notified_leases"],
        serde_json::json!([]),
        "{started}"
    );
    let r = bl(&lab, &admin, c, &["maintenance", "end", caps::SCREEN]).await;
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        format!("{} is out of maintenance: available", caps::SCREEN)
    );

    // Not an admin: refused, exit 3, the code on stderr; nothing changed.
    let r = bl(
        &lab,
        &lab.hw_token,
        c,
        &["maintenance", "start", caps::SCREEN, "--reason", "mine now"],
    )
    .await;
    assert_eq!(r.code, 3, "stderr: {}", r.stderr);
    assert!(r.stderr.contains("403 forbidden"), "{}", r.stderr);
    let r = bl(
        &lab,
        &lab.hw_token,
        c,
        &["capability", "remove", caps::SCREEN],
    )
    .await;
    assert_eq!(r.code, 3, "stderr: {}", r.stderr);
    assert_eq!(
        listed_status(&lab, c, caps::SCREEN).await.as_deref(),
        Some("available")
    );

    // No reason, or both a capability and --provider: usage, exit 2.
    let r = bl(&lab, &admin, c, &["maintenance", "start", caps::SCREEN]).await;
    assert_eq!(r.code, 2, "stderr: {}", r.stderr);
    let r = bl(
        &lab,
        &admin,
        c,
        &[
            "maintenance",
            "end",
            caps::SCREEN,
            "--provider",
            PROVIDER_ID,
        ],
    )
    .await;
    assert_eq!(r.code, 2, "stderr: {}", r.stderr);

    // Removing one not in maintenance: 409, exit 5, the code in the
    // message and in the --json answer.
    let r = bl(&lab, &admin, c, &["capability", "remove", caps::SPEAKER]).await;
    assert_eq!(r.code, 5, "stderr: {}", r.stderr);
    assert!(
        r.stderr.contains("409 capability_not_in_maintenance"),
        "{}",
        r.stderr
    );
    let r = bl(
        &lab,
        &admin,
        c,
        &["--json", "capability", "remove", caps::SPEAKER],
    )
    .await;
    assert_eq!(r.code, 5);
    let answer = r.json();
    assert_eq!(answer["error"]["exit_code"], 5, "{answer}");
    assert_eq!(
        answer["error"]["answer"]["error"]["code"], "capability_not_in_maintenance",
        "{answer}"
    );

    // The whole bench in and out.
    let r = bl(
        &lab,
        &admin,
        c,
        &[
            "maintenance",
            "start",
            "--provider",
            PROVIDER_ID,
            "--reason",
            "rewiring",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    assert!(
        r.stdout.starts_with(&format!(
            "{} capabilities of {PROVIDER_ID} in maintenance (rewiring): ",
            caps::ALL.len()
        )) && r.stdout.contains(caps::ROBOT),
        "{}",
        r.stdout
    );
    for cap in caps::ALL {
        assert_eq!(
            listed_status(&lab, c, cap).await.as_deref(),
            Some("maintenance"),
            "{cap}"
        );
    }
    let ended = ok(
        &lab,
        &admin,
        c,
        &["--json", "maintenance", "end", "--provider", PROVIDER_ID],
    )
    .await;
    let statuses: Vec<&str> = ended["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["status"].as_str())
        .collect();
    assert_eq!(statuses, vec!["available"; caps::ALL.len()], "{ended}");

    // Retire the speaker: into maintenance, removed, gone from `caps`.
    ok(
        &lab,
        &admin,
        c,
        &[
            "--json",
            "maintenance",
            "start",
            caps::SPEAKER,
            "--reason",
            "retired",
        ],
    )
    .await;
    let r = bl(&lab, &admin, c, &["capability", "remove", caps::SPEAKER]).await;
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    assert_eq!(r.stdout.trim(), format!("{} removed", caps::SPEAKER));
    assert_eq!(listed_status(&lab, c, caps::SPEAKER).await, None);
    let r = bl(&lab, &admin, c, &["capability", "remove", caps::SPEAKER]).await;
    assert_eq!(r.code, 4, "removed twice: {}", r.stderr);
}

#[test]
fn completions_and_the_man_page_come_from_the_same_definitions() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(workspace_bin("benchlink"))
            .args(args)
            .output()
            .expect("run benchlink");
        assert!(out.status.success(), "benchlink {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let man = run(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH benchlink 1"),
        "{man}"
    );
    let bash = run(&["completions", "bash"]);
    let zsh = run(&["completions", "zsh"]);
    for sub in [
        "caps", "who", "lease", "artifact", "watch", "audit", "earth", "mcp",
    ] {
        assert!(man.contains(sub), "the man page lists {sub}");
        assert!(
            bash.contains(sub) && zsh.contains(sub),
            "completions offer {sub}"
        );
    }
    assert!(
        man.contains("Exit codes"),
        "the man page has the exit codes"
    );
    let bad = std::process::Command::new(workspace_bin("benchlink"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    let not_a_url = std::process::Command::new(workspace_bin("benchlink"))
        .args(["--url", "not-a-url", "--token", "t", "caps"])
        .env_remove("BENCHLINK_TOKEN_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&not_a_url.stderr);
    assert_eq!(not_a_url.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not-a-url"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_the_registry_restarts_without_gap_or_repeat() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let mut lab = Lab::start(LabOptions::default()).await.expect("lab");
    let cfg = tempfile::tempdir().unwrap();
    let c = cfg.path();
    let mut watch = command(&lab, &lab.admin_token, c)
        .args([
            "--json",
            "watch",
            "--after",
            "0",
            "--types",
            "lease_granted",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<Value> = Vec::new();
    let before = ok(&lab, &lab.hw_token, c, &["--json", "lease", caps::CAMERA]).await;
    while !seen.iter().any(|e| e["lease_id"] == before["lease_id"]) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("the first grant in time")
            .unwrap()
            .expect("watch still running");
        seen.push(serde_json::from_str(&line).unwrap());
    }

    // The connection drops with the registry; watch keeps retrying.
    lab.stop_registry();
    lab.start_registry().expect("registry back");
    lab.wait_registered(Duration::from_secs(30))
        .await
        .expect("bench back");
    let after = ok(&lab, &lab.hw_token, c, &["--json", "lease", caps::PSU]).await;
    while !seen.iter().any(|e| e["lease_id"] == after["lease_id"]) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("the grant after the restart in time")
            .unwrap()
            .expect("watch still running");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    let ids: Vec<u64> = seen.iter().filter_map(|e| e["event_id"].as_u64()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "no event twice, in order: {ids:?}");
    let _ = watch.kill().await;
}
