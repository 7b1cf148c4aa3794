//! Embeds every file under `console/` (the web console's static assets) in
//! the binary: writes `$OUT_DIR/console_assets.rs`, a table of
//! `(relative path, include_bytes!(...))`, so an asset added to the folder
//! is served without a code change.
//!
//! Also embeds, as `vendor/{name}`, the few third-party files the Earth
//! page loads (d3-array, d3-geo, topojson-client, world-atlas' Natural
//! Earth TopoJSON), copied from `console-vendor/node_modules`, which
//! `scripts/setup.sh` installs from the lockfile (`npm ci`). When they are
//! not installed the build still succeeds with a warning, and the Earth
//! page says the map files are missing.

use std::path::{Path, PathBuf};

fn collect(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            collect(&path, base, out);
        } else if let Ok(rel) = path.strip_prefix(base) {
            let rel = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path.clone()));
        }
    }
}

/// `(served name, path under console-vendor/node_modules)`.
const VENDORED: &[(&str, &str)] = &[
    ("vendor/d3-array.min.js", "d3-array/dist/d3-array.min.js"),
    ("vendor/d3-geo.min.js", "d3-geo/dist/d3-geo.min.js"),
    (
        "vendor/topojson-client.min.js",
        "topojson-client/dist/topojson-client.min.js",
    ),
    (
        "vendor/countries-110m.json",
        "world-atlas/countries-110m.json",
    ),
];

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = root.join("console");
    println!("cargo:rerun-if-changed=console");
    let mut files = Vec::new();
    collect(&dir, &dir, &mut files);
    let modules = root.join("console-vendor/node_modules");
    // The whole folder (a few small packages), so `npm ci` creating
    // node_modules is noticed.
    println!("cargo:rerun-if-changed=console-vendor");
    for (name, rel) in VENDORED {
        let path = modules.join(rel);
        if path.is_file() {
            files.push((name.to_string(), path));
        } else {
            println!(
                "cargo:warning=console: {} is not installed (scripts/setup.sh runs npm ci in cloud-registry/console-vendor); the Earth page will have no map",
                path.display()
            );
        }
    }
    files.sort();
    let mut src = String::from("&[\n");
    for (rel, path) in &files {
        src.push_str(&format!(
            "    ({:?}, include_bytes!({:?}) as &[u8]),\n",
            rel,
            path.display().to_string()
        ));
    }
    src.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("console_assets.rs");
    std::fs::write(out, src).expect("write console_assets.rs");
}
