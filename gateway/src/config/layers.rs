//! How the configuration is assembled from its layers, lowest first: defaults → the file
//! (`--config`) → the environment → the everyday flags → `--set KEY=VALUE` (in order).
//!
//! Every layer writes into one TOML tree, the shape of the file, which is deserialised once
//! into [`GatewayConfig`] and validated. A value from the environment, a flag or `--set` is
//! read as its setting's type says ([`super::settings::kind_at`]), so a wrong value is
//! refused where it came from. Each key a layer sets is remembered with its layer (the
//! provenance), so an error about a setting, a type error or a range check alike, says which
//! layer set it: `invalid routing.block_size = "0": must be at least 1 (routing.block_size
//! from env PREFIXGATE_ROUTING_BLOCK_SIZE)`.
//!
//! Environment names: `PREFIXGATE_SECTION_KEY` for every key under plain tables (derived from
//! the key, [`super::settings::env_name`]), plus the documented older names in
//! [`ENV_ALIASES`] (AIBrix's `AIBRIX_PREFIX_CACHE_*`, prefixgate's `PREFIXGATE_API_KEYS` and
//! `PREFIXGATE_PREFIX_LOAD_*`), read first so that the derived name wins when both are set.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use super::GatewayConfig;
use super::error::ConfigFileError;
use super::settings::{self, Kind};

/// Environment names of settings that were removed, with what replaced them: set, they are
/// refused as the file and `--set` refuse an unknown key, rather than silently ignored.
pub const REMOVED_ENV: &[(&str, &str)] = &[
    (
        "PREFIXGATE_PREFIX_LOAD_COPY_IN_TIME_SECONDS",
        COPY_IN_TIME_REMOVED,
    ),
    (
        "PREFIXGATE_ROUTING_PREFIX_LOAD_COPY_IN_TIME_SECONDS",
        COPY_IN_TIME_REMOVED,
    ),
];

const COPY_IN_TIME_REMOVED: &str = "removed: the in-time rule under \
    routing.prefix_load.ttft_slo_seconds replaced it (docs/ROUTING.md, \"The SLO\"); unset it";

/// Older environment names, each the alias of a setting.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "routing.tokenizer"),
    ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "routing.block_size"),
    ("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "routing.block_capacity"),
    (
        "AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS",
        "routing.eviction_interval_secs",
    ),
    (
        "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
        "routing.eviction_duration_mins",
    ),
    ("AIBRIX_PREFIX_CACHE_HASH_SEED", "routing.hash_seed"),
    (
        "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
        "routing.imbalance_abs_count",
    ),
    (
        "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR",
        "routing.stddev_factor",
    ),
    (
        "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED",
        "kv_sync.enabled",
    ),
    ("PREFIXGATE_API_KEYS", "admission.api_keys"),
    (
        "PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT",
        "routing.prefix_load.prefill_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_PENDING_WEIGHT",
        "routing.prefix_load.pending_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_WAITING_WEIGHT",
        "routing.prefix_load.waiting_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_IDLE_PREFILL_WEIGHT",
        "routing.prefix_load.idle_prefill_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_FAMILY_WEIGHT",
        "routing.prefix_load.family_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_FAMILY_WINDOW_SECONDS",
        "routing.prefix_load.family_window_seconds",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_COPY_WEIGHT",
        "routing.prefix_load.copy_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_LEARN_WEIGHT",
        "routing.prefix_load.learn_weight",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_TTFT_SLO_SECONDS",
        "routing.prefix_load.ttft_slo_seconds",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_RECALL_BLOCKS",
        "routing.prefix_load.recall_blocks",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_GIVE_UP_LATE_SECONDS",
        "routing.prefix_load.give_up_late_seconds",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_SESSION_HELD_SHARE",
        "routing.prefix_load.session_held_share",
    ),
    (
        "PREFIXGATE_PREFIX_LOAD_SPREAD_FRACTION",
        "routing.prefix_load.spread_fraction",
    ),
];

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    Default,
    File(String),
    Env(String),
    /// An everyday flag, e.g. `--listen`.
    Flag(&'static str),
    Set,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layer::Default => f.write_str("the default"),
            Layer::File(path) => write!(f, "file {path}"),
            Layer::Env(name) => write!(f, "env {name}"),
            Layer::Flag(flag) => f.write_str(flag),
            Layer::Set => f.write_str("--set"),
        }
    }
}

/// The tree the layers write into, and who wrote each key.
#[derive(Debug, Default)]
pub struct Layers {
    tree: toml::Table,
    provenance: BTreeMap<String, Layer>,
}

impl Layers {
    /// The file's keys (the file alone must parse as a configuration, so that its errors
    /// keep their line numbers).
    pub fn file(&mut self, path: &Path) -> Result<(), ConfigFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: name.clone(),
            source,
        })?;
        let parse = |message: String| ConfigFileError::Parse {
            path: name.clone(),
            message,
        };
        GatewayConfig::from_toml_str(&text).map_err(|e| match e {
            ConfigFileError::Parse { message, .. } => parse(message),
            other => other,
        })?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| parse(e.to_string()))?;
        let mut keys = Vec::new();
        leaf_keys(&table, "", &mut keys);
        for key in keys {
            self.provenance.insert(key, Layer::File(name.clone()));
        }
        self.tree = table;
        Ok(())
    }

    /// The environment: the aliases, then every setting's own name; a removed setting's
    /// name is refused ([`REMOVED_ENV`]).
    pub fn env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<(), ConfigFileError> {
        for &(name, reason) in REMOVED_ENV {
            if lookup(name).is_some() {
                return Err(ConfigFileError::Layer {
                    key: name.to_owned(),
                    layer: Layer::Env(name.to_owned()).to_string(),
                    reason: reason.to_owned(),
                });
            }
        }
        let own = settings::settings()
            .iter()
            .filter_map(|s| Some((s.env.as_deref()?, s.key.as_str())));
        for (name, key) in ENV_ALIASES.iter().copied().chain(own) {
            if let Some(text) = lookup(name) {
                self.set_text(key, &text, Layer::Env(name.to_owned()))?;
            }
        }
        Ok(())
    }

    /// `KEY=VALUE` from `--set`.
    pub fn set(&mut self, assignment: &str) -> Result<(), ConfigFileError> {
        let Some((key, text)) = assignment.split_once('=') else {
            return Err(ConfigFileError::Layer {
                key: assignment.to_owned(),
                layer: Layer::Set.to_string(),
                reason: "expected KEY=VALUE".to_owned(),
            });
        };
        self.set_text(key.trim(), text, Layer::Set)
    }

    /// A value given as text by `layer`, read as the setting's kind.
    pub fn set_text(&mut self, key: &str, text: &str, layer: Layer) -> Result<(), ConfigFileError> {
        let refuse = |reason: String| ConfigFileError::Layer {
            key: key.to_owned(),
            layer: layer.to_string(),
            reason,
        };
        let (kind, optional) = settings::kind_at(key).ok_or_else(|| {
            refuse("no such setting (`prefixgate --help` lists them all)".to_owned())
        })?;
        let value = if optional && text.trim().is_empty() {
            None
        } else {
            match parse_value(&kind, text) {
                Ok(value) => Some(value),
                Err(reason) => return Err(refuse(format!("{text:?}: {reason}"))),
            }
        };
        self.set_value(key, value, layer);
        Ok(())
    }

    /// A value already typed (a flag's), or `None` to unset the key (a setting that is
    /// unset by default, given as an empty text).
    pub fn set_value(&mut self, key: &str, value: Option<toml::Value>, layer: Layer) {
        let mut keys = Vec::new();
        if let Some(toml::Value::Table(table)) = &value {
            leaf_keys(table, key, &mut keys);
        } else {
            keys.push(key.to_owned());
        }
        // A key set again replaces what was below it.
        let below = format!("{key}.");
        self.provenance
            .retain(|k, _| k != key && !k.starts_with(&below));
        for k in keys {
            self.provenance.insert(k, layer.clone());
        }
        let segments: Vec<&str> = key.split('.').collect();
        let (last, parents) = segments.split_last().unwrap_or((&"", &[]));
        let mut table = &mut self.tree;
        for segment in parents {
            let entry = table
                .entry((*segment).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            let toml::Value::Table(inner) = entry else {
                return;
            };
            table = inner;
        }
        match value {
            Some(value) => {
                table.insert((*last).to_owned(), value);
            }
            None => {
                table.remove(*last);
            }
        }
    }

    /// The configuration the layers make, validated; an error names the settings it is
    /// about and the layer each came from.
    pub fn resolve(self) -> Result<GatewayConfig, ConfigFileError> {
        let config: GatewayConfig = toml::Value::Table(self.tree.clone())
            .try_into()
            .map_err(|e: toml::de::Error| self.deserialize_error(&e.to_string()))?;
        config.validate().map_err(|e| self.sourced(e))?;
        Ok(config)
    }

    /// A value that the tree cannot hold (toml names the key as "in `KEY`").
    fn deserialize_error(&self, message: &str) -> ConfigFileError {
        let key = message
            .rsplit_once("in `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(key, _)| key.to_owned());
        let text = message.lines().next().unwrap_or(message).to_owned();
        match key {
            Some(key) => ConfigFileError::Layer {
                layer: self.layer_of(&key).to_string(),
                key,
                reason: text,
            },
            None => ConfigFileError::Parse {
                path: "the settings".to_owned(),
                message: message.to_owned(),
            },
        }
    }

    /// Who set `key`: its own layer or, for a key inside a table a layer set whole, that
    /// layer's.
    fn layer_of(&self, key: &str) -> Layer {
        let mut probe = key;
        loop {
            if let Some(layer) = self.provenance.get(probe) {
                return layer.clone();
            }
            match probe.rsplit_once(['.', '[']) {
                Some((parent, _)) => probe = parent,
                None => return Layer::Default,
            }
        }
    }

    /// `error`, with the layer of every setting its message names.
    fn sourced(&self, error: ConfigFileError) -> ConfigFileError {
        let message = error.to_string();
        let mut named: Vec<String> = Vec::new();
        let candidates = settings::settings()
            .iter()
            .map(|s| s.key.as_str())
            .chain(self.provenance.keys().map(String::as_str));
        for key in candidates {
            let concrete = !key.contains('<') && !key.contains("[]");
            if concrete && mentions(&message, key) && !named.iter().any(|n| n == key) {
                named.push(key.to_owned());
            }
        }
        if named.is_empty() {
            return error;
        }
        let sources = named
            .iter()
            .map(|key| format!("{key} from {}", self.layer_of(key)))
            .collect::<Vec<_>>()
            .join("; ");
        ConfigFileError::Sourced {
            error: Box::new(error),
            sources,
        }
    }
}

/// Whether `message` names `key` as a whole, not as part of a longer key (a `.` ending a
/// sentence is not a longer key).
fn mentions(message: &str, key: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    message.match_indices(key).any(|(at, _)| {
        let before = message[..at].chars().next_back();
        let mut after = message[at + key.len()..].chars();
        let longer = match after.next() {
            Some('.') => after.next().is_some_and(word),
            Some(c) => word(c),
            None => false,
        };
        !before.is_some_and(|c| word(c) || c == '.') && !longer
    })
}

/// The dotted keys of a table's leaves (a list of tables is one leaf).
fn leaf_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (name, value) in table {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            toml::Value::Table(inner) => leaf_keys(inner, &key, out),
            _ => out.push(key),
        }
    }
}

/// A value given as text, as `kind` reads it.
fn parse_value(kind: &Kind, text: &str) -> Result<toml::Value, String> {
    let trimmed = text.trim();
    let value = match kind {
        Kind::Bool => match trimmed.to_ascii_lowercase().as_str() {
            "true" | "1" => toml::Value::Boolean(true),
            "false" | "0" => toml::Value::Boolean(false),
            _ => return Err("expected true or false".to_owned()),
        },
        Kind::Integer { min, max } => {
            let n: i64 = trimmed
                .parse()
                .map_err(|_| "expected a whole number".to_owned())?;
            // i64 to f64 is exact for every bound a Rust integer type has that i64 holds.
            #[expect(
                clippy::cast_precision_loss,
                reason = "compared with the type's bounds"
            )]
            let as_float = n as f64;
            if min.is_some_and(|m| as_float < m) || max.is_some_and(|m| as_float > m) {
                // A bound the type does not set is left unsaid (an unsigned count has a
                // minimum only), rather than printed as f64's 309-digit extreme.
                return Err(match (min, max) {
                    (Some(lo), Some(hi)) => format!("expected a whole number from {lo} to {hi}"),
                    (Some(lo), None) => format!("expected a whole number of at least {lo}"),
                    (None, Some(hi)) => format!("expected a whole number of at most {hi}"),
                    (None, None) => "expected a whole number".to_owned(),
                });
            }
            toml::Value::Integer(n)
        }
        Kind::Float => toml::Value::Float(
            trimmed
                .parse()
                .map_err(|_| "expected a number".to_owned())?,
        ),
        Kind::Text => toml::Value::String(trimmed.to_owned()),
        Kind::Choice(words) => {
            if !words.iter().any(|w| w == trimmed) {
                return Err(format!("expected one of {}", words.join(", ")));
            }
            toml::Value::String(trimmed.to_owned())
        }
        Kind::List(item) => {
            if trimmed.starts_with('[') {
                inline_toml(trimmed)?
            } else {
                // Comma-separated; items trimmed, empty items dropped ("a, b," is a and b).
                let mut items = Vec::new();
                for part in trimmed.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    items.push(parse_value(item, part)?);
                }
                // A blank value is far more often a missing secret or a typo than a wish to
                // empty the list (PREFIXGATE_API_KEYS=" " must not open the gateway), so the
                // empty list is written out.
                if items.is_empty() {
                    return Err("no items; an empty list is written []".to_owned());
                }
                toml::Value::Array(items)
            }
        }
        Kind::Tables => inline_toml(trimmed)?,
    };
    Ok(value)
}

/// A TOML value written inline (`[{name = "a", url = "http://h:1"}]`).
fn inline_toml(text: &str) -> Result<toml::Value, String> {
    let table: toml::Table =
        toml::from_str(&format!("value = {text}")).map_err(|e| format!("not TOML: {e}"))?;
    table
        .get("value")
        .cloned()
        .ok_or_else(|| "no value".to_owned())
}
