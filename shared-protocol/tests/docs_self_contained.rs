//! The user documentation stands on its own: it cites no specification
//! the repository does not ship ("seed 001 §6.4"), it says what is meant.

/// The pages checked, relative to the workspace root.
const PAGES: &[&str] = &[
    "README.md",
    "docs/actions.md",
    "docs/audit-protocol.md",
    "docs/architecture.md",
    "docs/benchmarks.md",
    "docs/cli.md",
    "docs/console.md",
    "docs/devices.md",
    "docs/earth-command.md",
    "docs/http-api.md",
    "docs/install-edge-agent.md",
    "docs/mcp.md",
    "docs/scale.md",
    "config/cloud-registry.toml",
    "config/edge-agent.example.toml",
    "config/edge-agent.sim.toml",
];

#[test]
fn docs_cite_no_unshipped_specification() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for page in PAGES {
        let text =
            std::fs::read_to_string(root.join(page)).unwrap_or_else(|e| panic!("read {page}: {e}"));
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            if lower.contains('§')
                || lower.contains("seed 00")
                || lower.contains("seed \"")
                || lower.contains("(seed")
                || lower.contains("both specifications")
            {
                found.push(format!("{page}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of a specification not in the repository:\n{}",
        found.join("\n")
    );
}
