//! The OpenAPI 3.1 document at `GET /api/v1/openapi.json`
//! (docs/http-api.md "OpenAPI document"), against a real lab (registry,
//! edge daemon, simulated bench):
//! - every route the registry serves is in the document, every
//!   documented operation is served, and docs/http-api.md's endpoint
//!   tables list the same operations;
//! - a bounded schemathesis run (pinned in tests/schemathesis/
//!   requirements.txt, installed by ./scripts/setup.sh into
//!   tests/schemathesis/.venv) finds no 5xx and no answer that breaks the
//!   document. Without schemathesis it is skipped with a note, and fails
//!   under `CI=true`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use benchlink_e2e::bench::{Lab, LabOptions};
use serde_json::Value;

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// Routes registered outside the document, with the reason; any other
/// `.route(` in the registry's router code fails [`every_route_is_documented`].
const UNDOCUMENTED: &[(&str, &str, &str)] = &[(
    "cloud-registry/src/console/mod.rs",
    "/console/",
    "the web console's static files (HTML, JS, CSS), not part of the API",
)];

/// Routers that are not the API's, with a reason: their plain routes are
/// not the documented operations.
const OTHER_ROUTERS: &[(&str, &str)] = &[(
    "cloud-registry/src/cluster/forward.rs",
    "a standby's proxy: it answers the documented /healthz about itself and forwards every \
     other request to the leader, whose API the document describes",
)];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

async fn document(lab: &Lab) -> Value {
    let resp = reqwest::get(format!("{}/api/v1/openapi.json", lab.base_url))
        .await
        .expect("GET /api/v1/openapi.json");
    assert_eq!(resp.status(), 200, "the document needs no token");
    let doc: Value = resp.json().await.expect("the document is JSON");
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "OpenAPI 3.1: {}",
        doc["openapi"]
    );
    doc
}

/// (method, path) of every documented operation.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                ops.insert((m.to_string(), path.clone()));
            }
        }
    }
    ops
}

/// The registry's router code, without its `#[cfg(test)]` modules:
/// (path relative to the workspace, text).
fn router_sources() -> Vec<(String, String)> {
    let root = workspace();
    let mut out = Vec::new();
    let mut dirs = vec![
        root.join("cloud-registry/src"),
        root.join("cloud-registry/agents/src"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                // Benchmark binaries build their own routers for load runs.
                if path.file_name().is_some_and(|n| n != "bin") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read source");
                let text = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                let rel = path
                    .strip_prefix(&root)
                    .expect("under the workspace")
                    .display()
                    .to_string();
                out.push((rel, text));
            }
        }
    }
    out
}

/// A served route is in the document: every feature router adds its
/// routes with utoipa-axum's `routes!()`, which takes only handlers with a
/// `#[utoipa::path]` (the path and method come from it), so a route outside
/// the document can only be added with a plain `.route(` (or
/// `route_service` / `nest_service`): none may appear in the router code
/// but the listed exclusions. And the other way: every documented
/// operation is served (a request without a token is not answered
/// `route_not_found` or `method_not_allowed`), and so are the excluded
/// console files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_documented() {
    let mut plain = Vec::new();
    for (file, text) in router_sources() {
        for needle in [".route(", ".route_service(", ".nest_service("] {
            for (line_no, line) in text.lines().enumerate() {
                if line.contains(needle)
                    && !UNDOCUMENTED.iter().any(|(f, _, _)| *f == file)
                    && !OTHER_ROUTERS.iter().any(|(f, _)| *f == file)
                {
                    plain.push(format!("{file}:{}: {}", line_no + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        plain.is_empty(),
        "routes added outside the OpenAPI document (use `.routes(routes!(handler))` with a \
         `#[utoipa::path]` on the handler, or list the route in UNDOCUMENTED with a reason):\n{}",
        plain.join("\n")
    );

    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let doc = document(&lab).await;
    let ops = operations(&doc);
    assert!(ops.len() > 50, "{} operations documented", ops.len());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut unserved = Vec::new();
    for (method, path) in &ops {
        // Path parameters: `1` parses as every id type the API has.
        let concrete: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "1" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let resp = http
            .request(m, format!("{}{concrete}", lab.base_url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {concrete}: {e}"));
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str().unwrap_or("");
        if status == 405 || code == "route_not_found" || code == "method_not_allowed" {
            unserved.push(format!("{method} {path}: {status} {code}"));
        }
    }
    assert!(
        unserved.is_empty(),
        "documented but not served: {unserved:?}"
    );
    for (_, path, why) in UNDOCUMENTED {
        let resp = http
            .get(format!("{}{path}", lab.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path} ({why}) is served");
        assert!(
            !doc["paths"].as_object().unwrap().contains_key(*path),
            "{path} is listed as undocumented but is in the document"
        );
    }
    // Health and metrics are documented, at the root and under /api/v1.
    for p in ["/healthz", "/metrics", "/time", "/api/v1/healthz"] {
        assert!(ops.contains(&("get".to_string(), p.to_string())), "{p}");
    }
    let drift = docs_drift(&ops);
    assert!(
        drift.is_empty(),
        "docs/http-api.md's endpoint tables and the OpenAPI document differ:\n{}",
        drift.join("\n")
    );
    // Client generators name methods by operationId: one per operation.
    let mut ids = BTreeSet::new();
    for (method, path) in &ops {
        let id = doc["paths"][path][method]["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path} has an operationId"));
        assert!(ids.insert(id.to_string()), "operationId {id} is used twice");
    }
    // The error shape is a shared component every error answer points at.
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// `{name}` → `{}`, and the health routes (served at the root and under
/// `/api/v1`) at the root, so docs and document compare by shape.
fn normalized(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    for p in ["/healthz", "/metrics", "/time"] {
        if out == format!("/api/v1{p}") {
            return p.to_string();
        }
    }
    out
}

/// What docs/http-api.md's endpoint tables (`| METHOD | `path`, ... |`
/// rows, query strings left out) and the document's operations do not
/// share; the console's files are in the tables but not the document.
fn docs_drift(ops: &BTreeSet<(String, String)>) -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("docs/http-api.md")).unwrap();
    let mut listed = BTreeSet::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[0].is_empty() {
            continue;
        }
        let method = cells[1].to_lowercase();
        if !METHODS.contains(&method.as_str()) {
            continue;
        }
        for path in cells[2].split('`').skip(1).step_by(2) {
            let path = path.split(['?', '[']).next().unwrap_or("");
            if path.starts_with('/') && !path.starts_with("/console") {
                listed.insert((method.clone(), normalized(path)));
            }
        }
    }
    let documented: BTreeSet<(String, String)> = ops
        .iter()
        .map(|(m, p)| (m.clone(), normalized(p)))
        .collect();
    let mut drift: Vec<String> = documented
        .difference(&listed)
        .map(|(m, p)| format!("in the document, not in docs/http-api.md: {m} {p}"))
        .collect();
    drift.extend(
        listed
            .difference(&documented)
            .map(|(m, p)| format!("in docs/http-api.md, not in the document: {m} {p}")),
    );
    drift
}

/// The schemathesis executable of tests/schemathesis/.venv, or `None`
/// (with a note; a failure under `CI=true`).
fn schemathesis() -> Option<PathBuf> {
    let exe = workspace().join("tests/schemathesis/.venv/bin/schemathesis");
    if exe.exists() {
        return Some(exe);
    }
    let why = format!(
        "{} is missing: run ./scripts/setup.sh (it installs schemathesis from tests/schemathesis/requirements.txt)",
        exe.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// Paths the fuzz run leaves out (schemathesis `--exclude-path`), with the
/// reason. The SSE stream stays in: schemathesis reads a bounded part of
/// it.
const FUZZ_EXCLUDED: &[(&str, &str)] = &[
    (
        "/api/v1/tokens/{name}",
        "revoking tokens: a generated name may be the one the run itself uses",
    ),
    (
        "/api/v1/agents/speech/transcriptions",
        "the lab configures no speech provider, so every answer is 503 `asr_not_configured` \
         by design (cloud-registry/tests/agents_runtime.rs drives it against a stand-in)",
    ),
];

/// Operations (by `operationId`, the handler's name) the fuzz run leaves
/// out, with the reason.
const FUZZ_EXCLUDED_OPERATIONS: &[(&str, &str)] = &[(
    "create_run",
    "the lab configures no model, so the run types that need one answer 503 \
     `model_not_configured` by design (cloud-registry/tests/agents_runtime.rs runs them \
     against a stand-in model)",
)];

/// A bounded schemathesis run against the live registry, authenticated as
/// the lab's admin: no answer is a 5xx, and every answer has a documented
/// status and matches the documented schema. On failure the test prints
/// schemathesis's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuzz_run_from_the_document_finds_no_5xx_and_no_nonconformance() {
    let Some(exe) = schemathesis() else { return };
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    document(&lab).await;
    let reports = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(&exe);
    cmd.current_dir(reports.path())
        .arg("--no-color")
        .arg("run")
        .arg(format!("{}/api/v1/openapi.json", lab.base_url))
        .args(["--url", &lab.base_url])
        .args([
            "--header",
            &format!("Authorization: Bearer {}", lab.admin_token),
        ])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance",
        ])
        .args(["--max-examples", "10"])
        .args(["--max-time", "120"])
        .args(["--request-timeout", "15"])
        .args(["--seed", "1"])
        // One worker: Python 3.11's parser is not safe to use from several
        // threads, which hypothesis does to describe its strategies.
        .args(["--workers", "1"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--generation-database", "none"]);
    for (path, _why) in FUZZ_EXCLUDED {
        cmd.args(["--exclude-path", path]);
    }
    for (operation_id, _why) in FUZZ_EXCLUDED_OPERATIONS {
        cmd.args(["--exclude-operation-id", operation_id]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("schemathesis finished within 180 s")
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found failures ({}):\n{stdout}\n{stderr}",
        out.status
    );
    println!("{stdout}");
}
