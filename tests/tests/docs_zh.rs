//! Every documentation page that has a Chinese counterpart keeps it in
//! step: `docs/technical/en/X.md` ↔ `docs/technical/zh/X.md` (both ways),
//! and `docs/zh/X.md` ↔ `docs/X.md`. Two pages are in step when their
//! headings have the same levels in the same order and each heading's
//! `code spans` are the same (the prose of a heading is translated, its
//! identifiers are not). The operator pages in [`OPERATOR_PAGES`] must
//! have their `docs/zh/` page.

use std::path::{Path, PathBuf};

/// The operator-facing pages that must exist in Chinese under `docs/zh/`.
const OPERATOR_PAGES: [&str; 8] = [
    "install-edge-agent",
    "install-registry",
    "devices",
    "http-api",
    "actions",
    "audit-protocol",
    "earth-command",
    "console",
];

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// `path` from the top of the checkout, as the messages name it.
fn rel(path: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// One heading: its level (number of `#`) and its code spans.
#[derive(Debug, PartialEq)]
struct Heading {
    level: usize,
    code: Vec<String>,
}

/// The headings of a Markdown page, outside fenced code blocks.
fn headings(text: &str) -> Vec<(Heading, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if level == 0 || !line[level..].starts_with(' ') {
            continue;
        }
        let code = line
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        out.push((Heading { level, code }, line.to_string()));
    }
    out
}

/// `None` when in step, else what differs first.
fn difference(en: &str, zh: &str) -> Option<String> {
    let (a, b) = (headings(en), headings(zh));
    for (i, pair) in a.iter().zip(b.iter()).enumerate() {
        if pair.0 .0 != pair.1 .0 {
            return Some(format!(
                "heading {} differs: {:?} vs {:?}",
                i + 1,
                pair.0 .1,
                pair.1 .1
            ));
        }
    }
    (a.len() != b.len()).then(|| {
        format!(
            "{} headings vs {}; the first unmatched: {:?}",
            a.len(),
            b.len(),
            a.get(b.len()).or(b.get(a.len())).map(|h| &h.1)
        )
    })
}

fn md_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    names
}

/// Every pair that must be in step, and the pages missing their half.
fn pairs() -> (Vec<(PathBuf, PathBuf)>, Vec<String>) {
    let root = docs();
    let (mut pairs, mut missing) = (Vec::new(), Vec::new());
    let (en, zh) = (root.join("technical/en"), root.join("technical/zh"));
    for name in md_files(&en) {
        let other = zh.join(&name);
        if other.exists() {
            pairs.push((en.join(&name), other));
        } else {
            missing.push(format!(
                "docs/technical/en/{name} has no docs/technical/zh/{name}"
            ));
        }
    }
    for name in md_files(&zh) {
        if !en.join(&name).exists() {
            missing.push(format!(
                "docs/technical/zh/{name} has no docs/technical/en/{name}"
            ));
        }
    }
    for page in OPERATOR_PAGES {
        if !root.join("zh").join(format!("{page}.md")).exists() {
            missing.push(format!("docs/{page}.md has no docs/zh/{page}.md"));
        }
    }
    if root.join("zh").is_dir() {
        for name in md_files(&root.join("zh")) {
            let english = root.join(&name);
            if english.exists() {
                pairs.push((english, root.join("zh").join(&name)));
            } else {
                missing.push(format!("docs/zh/{name} has no docs/{name}"));
            }
        }
    }
    (pairs, missing)
}

#[test]
fn every_page_with_a_chinese_counterpart_has_the_same_headings() {
    // Missing halves and heading differences are reported together.
    let (pairs, mut problems) = pairs();
    // The pages seed 000 names are there in both languages.
    for page in ["agents-aiprovider", "manual", "earth-frontend-context"] {
        assert!(
            pairs
                .iter()
                .any(|(en, _)| en.ends_with(format!("technical/en/{page}.md"))),
            "docs/technical/en/{page}.md"
        );
    }
    for (en, zh) in &pairs {
        let (a, b) = (
            std::fs::read_to_string(en).unwrap(),
            std::fs::read_to_string(zh).unwrap(),
        );
        if let Some(d) = difference(&a, &b) {
            problems.push(format!("{} / {}: {d}", rel(en), rel(zh)));
        }
        if !a.contains("[中文](") {
            problems.push(format!("{} does not link its Chinese page", rel(en)));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_check_sees_a_missing_heading_and_a_changed_code_span() {
    let en = "# Title\n\n## Lease `grace_period`\n\n```toml\n# not a heading\n```\n### Errors\n";
    assert_eq!(
        difference(en, "# 标题\n\n## 租约 `grace_period`\n\n### 错误\n"),
        None
    );
    let dropped = difference(en, "# 标题\n\n## 租约 `grace_period`\n");
    assert!(dropped.unwrap().contains("3 headings vs 2"));
    let renamed = difference(en, "# 标题\n\n## 租约 `grace`\n\n### 错误\n");
    assert!(renamed.unwrap().contains("heading 2 differs"));
    let level = difference(en, "# 标题\n\n### 租约 `grace_period`\n\n### 错误\n");
    assert!(level.is_some());
}
