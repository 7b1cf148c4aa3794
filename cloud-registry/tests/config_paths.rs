//! Relative paths in the registry's TOML follow the config file, not the
//! working directory: `token create` run from elsewhere writes to the
//! store `serve` uses, never to a second one beside the caller.

use std::process::Command;

#[test]
fn token_create_from_another_directory_uses_the_configured_store() {
    let lab = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let config = lab.path().join("reg/cloud-registry.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(
        &config,
        "[store]\npath = \"var/registry.sqlite3\"\n[http]\nlisten = \"127.0.0.1:0\"\n[mqtt]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
            .args(args)
            .arg("--config")
            .arg(&config)
            .current_dir(elsewhere.path())
            .output()
            .expect("run cloud-registry");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&[
        "token",
        "create",
        "--role",
        "viewer",
        "--name",
        "viewer-1",
        "--create-store",
    ]);
    assert!(
        lab.path().join("reg/var/registry.sqlite3").exists(),
        "the store is beside the config file"
    );
    assert!(
        !elsewhere.path().join("var").exists(),
        "nothing was created in the working directory"
    );
    let listed = run(&["token", "list", "--json"]);
    assert!(listed.contains("viewer-1"), "{listed}");
}
