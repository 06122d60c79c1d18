//! The list of every setting, read from the configuration's schema: its key, type, default,
//! environment name and doc comment, all from the serde structs themselves (their
//! `schemars::JsonSchema` derive turns doc comments into descriptions).
//!
//! This is what `prefixgate --help` and docs/GATEWAY.md list, and what the layers above the
//! file ([`super::layers`]) consult to know whether a key exists and how to read its value, so
//! adding a setting is one struct field and its doc comment.
//!
//! Keys are dotted paths (`routing.block_size`). A table of named entries shows its entry as
//! `<name>` (`admission.tenants.<name>.max_in_flight`); a list of tables as `[]`
//! (`backends[].url`). Only keys under plain tables have an environment name:
//! `PREFIXGATE_` and the path in capitals with `_` for `.` (`PREFIXGATE_ROUTING_BLOCK_SIZE`).

use std::sync::LazyLock;

use serde_json::{Map, Value as Json};

use super::GatewayConfig;

/// The prefix of every setting's environment name.
pub const ENV_PREFIX: &str = "PREFIXGATE_";

/// What a setting holds, as its value is read from the environment or `--set`.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Bool,
    /// A whole number, within the bounds of its Rust type.
    Integer {
        min: Option<f64>,
        max: Option<f64>,
    },
    Float,
    Text,
    /// One of these words.
    Choice(Vec<String>),
    /// A list of values of one kind (comma-separated in the environment and `--set`).
    List(Box<Kind>),
    /// A list of tables (`[[backends]]`): a TOML array in `--set`.
    Tables,
}

impl Kind {
    /// The kind as a reader says it.
    pub fn describe(&self) -> String {
        match self {
            Kind::Bool => "true or false".to_owned(),
            Kind::Integer { .. } => "integer".to_owned(),
            Kind::Float => "number".to_owned(),
            Kind::Text => "string".to_owned(),
            Kind::Choice(words) => words.join(" | "),
            Kind::List(item) => format!("list of {}", item.describe()),
            Kind::Tables => "list of tables".to_owned(),
        }
    }
}

/// One setting.
#[derive(Debug, Clone)]
pub struct Setting {
    /// The dotted key.
    pub key: String,
    pub kind: Kind,
    /// The default as TOML text; `None` for a setting that is unset by default (or, in a
    /// table entry, required: see [`Setting::required`]).
    pub default: Option<String>,
    /// A key every entry of its table must give (`backends[].url`).
    pub required: bool,
    /// Its doc comment.
    pub doc: String,
    /// `PREFIXGATE_…`, for keys under plain tables.
    pub env: Option<String>,
}

impl Setting {
    /// The doc comment's first sentence (or first line), without a leading environment name
    /// that router-core's docs start with.
    pub fn summary(&self) -> String {
        let text = self
            .doc
            .split("\n\n")
            .next()
            .unwrap_or("")
            .replace('\n', " ");
        // Rustdoc links read as code.
        let text = text.replace("[`", "`").replace("`]", "`");
        let text = match text.split_once("`: ") {
            Some((name, rest))
                if name.starts_with("`AIBRIX_") || name.starts_with("`PREFIXGATE_") =>
            {
                let mut chars = rest.chars();
                chars
                    .next()
                    .map(|first| first.to_uppercase().chain(chars).collect())
                    .unwrap_or_default()
            }
            _ => text,
        };
        let end = text
            .match_indices(". ")
            .map(|(i, _)| i + 1)
            .next()
            .unwrap_or(text.len());
        text[..end].trim().to_owned()
    }
}

impl Setting {
    /// The default as `--help` shows it: the value, `unset` or `required`.
    pub fn shown_default(&self) -> &str {
        match (&self.default, self.required) {
            (Some(default), _) => default,
            (None, true) => "required",
            (None, false) => "unset",
        }
    }
}

/// The configuration's JSON schema (draft 2020-12, as schemars writes it).
fn schema() -> &'static Json {
    static SCHEMA: LazyLock<Json> = LazyLock::new(|| {
        serde_json::to_value(schemars::schema_for!(GatewayConfig)).unwrap_or(Json::Null)
    });
    &SCHEMA
}

/// The defaults, as the TOML tree the file would be.
fn defaults() -> &'static toml::Table {
    static DEFAULTS: LazyLock<toml::Table> =
        LazyLock::new(|| toml::Table::try_from(GatewayConfig::default()).unwrap_or_default());
    &DEFAULTS
}

/// Every setting, in the order of the structs' fields (tables after the top-level keys).
pub fn settings() -> &'static [Setting] {
    static SETTINGS: LazyLock<Vec<Setting>> = LazyLock::new(|| {
        let mut out = Vec::new();
        let root = schema();
        walk(
            root,
            root,
            &mut Vec::new(),
            Some(defaults()),
            true,
            &mut out,
        );
        // Plain keys first, then each table's, as a file is written.
        out.sort_by_key(|s| s.key.contains('.') || s.key.contains('['));
        out
    });
    &SETTINGS
}

/// The schema of a property with `$ref`, `Option` (`anyOf` with null) and `allOf` resolved;
/// the description is the property's own when it has one.
fn resolve<'a>(root: &'a Json, schema: &'a Json) -> (&'a Json, Option<&'a str>) {
    let description = schema.get("description").and_then(Json::as_str);
    let target = if let Some(reference) = schema.get("$ref").and_then(Json::as_str) {
        let name = reference.trim_start_matches("#/$defs/");
        root.get("$defs")
            .and_then(|d| d.get(name))
            .unwrap_or(&Json::Null)
    } else if let Some(alternatives) = schema
        .get("anyOf")
        .or_else(|| schema.get("allOf"))
        .and_then(Json::as_array)
    {
        match alternatives
            .iter()
            .find(|s| s.get("type").and_then(Json::as_str) != Some("null"))
        {
            Some(inner) => {
                return (
                    resolve(root, inner).0,
                    description.or(resolve(root, inner).1),
                );
            }
            None => schema,
        }
    } else {
        schema
    };
    if target.get("$ref").is_some() || target.get("allOf").is_some() {
        let (inner, inner_description) = resolve(root, target);
        return (inner, description.or(inner_description));
    }
    (
        target,
        description.or_else(|| target.get("description").and_then(Json::as_str)),
    )
}

/// The schema's type name, skipping `null` in a type list (`Option`).
fn type_name(schema: &Json) -> Option<&str> {
    match schema.get("type")? {
        Json::String(name) => Some(name),
        Json::Array(names) => names.iter().filter_map(Json::as_str).find(|n| *n != "null"),
        _ => None,
    }
}

/// A table's properties, if the schema is one with named keys.
fn properties(schema: &Json) -> Option<&Map<String, Json>> {
    schema.get("properties").and_then(Json::as_object)
}

/// The kind of a value schema that is not a table.
fn kind_of(root: &Json, schema: &Json) -> Kind {
    let (schema, _) = resolve(root, schema);
    let constants: Option<Vec<String>> = schema
        .get("oneOf")
        .and_then(Json::as_array)
        .map(|variants| {
            variants
                .iter()
                .filter_map(|v| v.get("const").and_then(Json::as_str).map(str::to_owned))
                .collect()
        })
        .or_else(|| {
            schema.get("enum").and_then(Json::as_array).map(|words| {
                words
                    .iter()
                    .filter_map(Json::as_str)
                    .map(str::to_owned)
                    .collect()
            })
        });
    if let Some(words) = constants.filter(|w| !w.is_empty()) {
        return Kind::Choice(words);
    }
    match type_name(schema) {
        Some("boolean") => Kind::Bool,
        Some("integer") => Kind::Integer {
            min: schema.get("minimum").and_then(Json::as_f64),
            max: schema.get("maximum").and_then(Json::as_f64),
        },
        Some("number") => Kind::Float,
        Some("array") => {
            let item = schema.get("items").unwrap_or(&Json::Null);
            if properties(resolve(root, item).0).is_some() {
                Kind::Tables
            } else {
                Kind::List(Box::new(kind_of(root, item)))
            }
        }
        _ => Kind::Text,
    }
}

/// Adds the settings under `schema` (a table) at `path`; `defaults` is the default tree
/// there, when there is one; `plain` says whether every table above is a plain one.
fn walk(
    root: &Json,
    schema: &Json,
    path: &mut Vec<String>,
    defaults: Option<&toml::Table>,
    plain: bool,
    out: &mut Vec<Setting>,
) {
    let (schema, _) = resolve(root, schema);
    let Some(properties) = properties(schema) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|names| names.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    for (name, property) in properties {
        path.push(name.clone());
        let (value, description) = resolve(root, property);
        let default = defaults.and_then(|d| d.get(name));
        let key = path.join(".");
        if properties_of_map(root, value).is_some() {
            // A table of named entries: its entry's keys under `<name>`.
            let entry = value.get("additionalProperties").unwrap_or(&Json::Null);
            path.push("<name>".to_owned());
            walk(root, entry, path, None, false, out);
            path.pop();
        } else if self::properties(value).is_some() {
            walk(
                root,
                value,
                path,
                default.and_then(toml::Value::as_table),
                plain,
                out,
            );
        } else {
            let kind = kind_of(root, value);
            if kind == Kind::Tables {
                let item = value.get("items").unwrap_or(&Json::Null);
                let last = path.pop().unwrap_or_default();
                path.push(format!("{last}[]"));
                walk(root, item, path, None, false, out);
            }
            let env = (plain && kind != Kind::Tables).then(|| env_name(&key));
            out.push(Setting {
                key,
                kind,
                default: default.map(toml_text),
                required: required.contains(&name.as_str()),
                doc: description.unwrap_or("").trim().to_owned(),
                env,
            });
        }
        path.pop();
    }
}

/// The entry schema of a table of named entries (`BTreeMap<String, T>`).
fn properties_of_map<'a>(root: &'a Json, schema: &'a Json) -> Option<&'a Json> {
    let entry = schema.get("additionalProperties")?;
    entry.is_object().then_some(())?;
    properties(resolve(root, entry).0).map(|_| entry)
}

/// `PREFIXGATE_` and the key in capitals, `_` for `.`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

fn toml_text(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(table) if table.is_empty() => "{}".to_owned(),
        other => other.to_string(),
    }
}

/// The kind of the value at `key` (dotted, with entry names where the schema has a table of
/// named entries: `admission.tenants.B.max_in_flight`), and whether the setting may be unset
/// (an `Option`); `None` when no such setting exists. A table (`upstream`,
/// `admission.tenants.B`) is not a setting: only leaves are set one at a time.
pub fn kind_at(key: &str) -> Option<(Kind, bool)> {
    let root = schema();
    let mut schema = root;
    let segments: Vec<&str> = key.split('.').collect();
    let mut i = 0;
    while i < segments.len() {
        let (table, _) = resolve(root, schema);
        if let Some(entry) = properties_of_map(root, table) {
            // Any entry name, then the entry's keys.
            schema = entry;
            i += 1;
            continue;
        }
        schema = properties(table)?.get(segments[i])?;
        i += 1;
    }
    let (leaf, _) = resolve(root, schema);
    if properties(leaf).is_some() || properties_of_map(root, leaf).is_some() {
        return None;
    }
    let nullable = |s: &Json| match s.get("type") {
        Some(Json::Array(types)) => types.iter().any(|t| t == "null"),
        Some(t) => t == "null",
        None => false,
    };
    let optional = nullable(schema)
        || schema
            .get("anyOf")
            .and_then(Json::as_array)
            .is_some_and(|alternatives| alternatives.iter().any(nullable));
    Some((kind_of(root, leaf), optional))
}

/// The settings as `--help` lists them: key, default and type, then the doc's first sentence
/// and the other names (`aliases`: older environment names; `flags`: everyday flags).
pub fn help_text(aliases: &[(&str, &str)], flags: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for setting in settings() {
        let default = setting.shown_default();
        text.push_str(&format!(
            "  {} = {}  ({})\n      {}\n",
            setting.key,
            default,
            setting.kind.describe(),
            setting.summary()
        ));
        let names = other_names(setting, aliases, flags);
        if !names.is_empty() {
            text.push_str(&format!("      {}\n", names.join(", ")));
        }
    }
    text
}

/// A setting's other names: its environment name, the aliases, the flag.
fn other_names(setting: &Setting, aliases: &[(&str, &str)], flags: &[(&str, &str)]) -> Vec<String> {
    let named = |list: &[(&str, &str)]| -> Vec<String> {
        list.iter()
            .filter(|(_, key)| *key == setting.key)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    };
    let env: Vec<String> = setting.env.iter().cloned().chain(named(aliases)).collect();
    let mut names = Vec::new();
    if !env.is_empty() {
        names.push(format!("env {}", env.join(", ")));
    }
    names.extend(named(flags).into_iter().map(|flag| format!("flag {flag}")));
    names
}

/// The settings as docs/GATEWAY.md's table lists them.
pub fn markdown(aliases: &[(&str, &str)], flags: &[(&str, &str)]) -> String {
    let mut text = String::from(
        "| key | default | type | what it does | other names |\n|---|---|---|---|---|\n",
    );
    for setting in settings() {
        let default = match &setting.default {
            Some(default) => format!("`{default}`"),
            None => setting.shown_default().to_owned(),
        };
        let names: Vec<String> = other_names(setting, aliases, flags)
            .iter()
            .map(|n| {
                let (what, list) = n.split_once(' ').unwrap_or(("", n));
                let list = list
                    .split(", ")
                    .map(|x| format!("`{x}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("{what} {list}")
            })
            .collect();
        text.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            setting.key,
            default.replace('|', "\\|"),
            setting.kind.describe().replace('|', "\\|"),
            setting.summary().replace('|', "\\|"),
            names.join("; "),
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::cli::everyday_flags;
    use crate::config::layers::ENV_ALIASES;

    const BEGIN: &str = "<!-- settings:begin -->\n";
    const END: &str = "<!-- settings:end -->";

    #[test]
    fn every_setting_has_a_doc_a_kind_and_one_environment_name() {
        let mut names = std::collections::BTreeSet::new();
        for setting in settings() {
            assert!(
                !setting.summary().is_empty(),
                "{}: no doc comment",
                setting.key
            );
            let plain = !setting.key.contains('<') && !setting.key.contains('[');
            if plain {
                assert!(
                    kind_at(&setting.key).is_some(),
                    "{}: not settable",
                    setting.key
                );
            }
            if let Some(env) = &setting.env {
                assert!(names.insert(env.clone()), "{env} names two settings");
            }
        }
        for (alias, _) in ENV_ALIASES {
            assert!(
                names.insert((*alias).to_owned()),
                "{alias} is also a setting's name"
            );
        }
        assert!(settings().len() > 60, "{} settings", settings().len());
    }

    #[test]
    fn kinds_follow_the_rust_types() {
        let kind = |key: &str| kind_at(key).unwrap();
        assert_eq!(kind("kv_sync.enabled"), (Kind::Bool, false));
        assert_eq!(
            kind("kv_sync.port").0,
            Kind::Integer {
                min: Some(0.0),
                max: Some(65535.0)
            }
        );
        assert_eq!(kind("routing.prefix_load.copy_weight").0, Kind::Float);
        assert_eq!(
            kind("routing.tokenizer").0,
            Kind::Choice(vec!["character".into(), "tiktoken".into(), "hf".into()])
        );
        assert_eq!(
            kind("admission.api_keys").0,
            Kind::List(Box::new(Kind::Text))
        );
        assert_eq!(kind("backends").0, Kind::Tables);
        assert_eq!(kind("routing.hf_tokenizer_path"), (Kind::Text, true));
        assert_eq!(
            kind("admission.tenants.anyone.token_burst").0,
            Kind::Integer {
                min: Some(0.0),
                max: None
            }
        );
        assert_eq!(kind_at("routing"), None, "a table is not a setting");
        assert_eq!(kind_at("routing.nope"), None);
    }

    /// docs/GATEWAY.md's table of settings is the one the schema renders. To rewrite it:
    /// `PREFIXGATE_UPDATE_DOCS=1 cargo test -p gateway --lib settings_table_is_current`.
    #[test]
    fn settings_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/GATEWAY.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let start = doc.find(BEGIN).expect("the settings:begin marker") + BEGIN.len();
        let end = doc.find(END).expect("the settings:end marker");
        let table = markdown(ENV_ALIASES, &everyday_flags());
        if std::env::var_os("PREFIXGATE_UPDATE_DOCS").is_some() {
            let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
            std::fs::write(path, updated).unwrap();
            return;
        }
        assert!(
            doc[start..end] == table,
            "docs/GATEWAY.md's settings table is stale; rewrite it with \
             PREFIXGATE_UPDATE_DOCS=1 cargo test -p gateway --lib settings_table_is_current"
        );
    }
}
