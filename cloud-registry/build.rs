//! Embeds every file under `console/` (the web console's static assets) in
//! the binary: writes `$OUT_DIR/console_assets.rs`, a table of
//! `(relative path, include_bytes!(...))`, so an asset added to the folder
//! is served without a code change.

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

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = root.join("console");
    println!("cargo:rerun-if-changed=console");
    let mut files = Vec::new();
    collect(&dir, &dir, &mut files);
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
