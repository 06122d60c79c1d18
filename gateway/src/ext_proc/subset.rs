//! The endpoint subset a Gateway API Inference Extension data plane may restrict a request
//! to (the endpoint picker protocol, "Endpoint Subset").
//!
//! Wire format: the ext_proc request's `metadata_context.filter_metadata` carries, under the
//! namespace `envoy.lb.subset_hint`, the key `x-gateway-destination-endpoint-subset` with a
//! list of `"ip:port"` strings. Without the namespace or the key (or with a key that is not a
//! list), every endpoint of the pool may be picked; with the list, only the replicas whose
//! address is in it, matched on the IP as the reference picker does (a pod serves on its
//! target port); an empty list, or one naming no ready replica, leaves nothing to pick and
//! the request gets 503. Entries that are not strings are ignored.

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;

use crate::replicas::Replica;

/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset list in that namespace.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// Which replicas a request may go to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Subset {
    /// No hint: any replica of the model.
    #[default]
    Any,
    /// Only replicas with one of these IPs (possibly none).
    Hosts(Vec<String>),
}

impl Subset {
    /// The hint in `metadata`; `None` when the message carries no `envoy.lb.subset_hint`
    /// namespace (the hint seen before, if any, stands).
    pub fn from_metadata(metadata: Option<&Metadata>) -> Option<Subset> {
        let namespace = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
        let hint = namespace
            .fields
            .get(SUBSET_KEY)
            .and_then(|v| v.kind.as_ref());
        let Some(Kind::ListValue(list)) = hint else {
            return Some(Subset::Any);
        };
        let hosts = list
            .values
            .iter()
            .filter_map(|value| match &value.kind {
                Some(Kind::StringValue(endpoint)) => Some(host(endpoint).to_owned()),
                _ => None,
            })
            .collect();
        Some(Subset::Hosts(hosts))
    }

    /// Whether `replica` is in the subset.
    pub fn admits(&self, replica: &Replica) -> bool {
        match self {
            Subset::Any => true,
            Subset::Hosts(hosts) => {
                let own = host(replica.authority());
                hosts.iter().any(|h| h == own)
            }
        }
    }
}

/// The host of `host:port` (`[v6]:port` too), without brackets; the whole text without a port.
fn host(endpoint: &str) -> &str {
    let endpoint = endpoint.trim();
    let host = match endpoint.rsplit_once(':') {
        // An IPv6 address without port has colons but no closing bracket before them.
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.is_empty() => {
            if host.contains(':') && !host.ends_with(']') {
                endpoint
            } else {
                host
            }
        }
        _ => endpoint,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

    use super::*;

    fn metadata(value: Option<Kind>) -> Metadata {
        let fields = value
            .map(|kind| HashMap::from([(SUBSET_KEY.to_owned(), Value { kind: Some(kind) })]))
            .unwrap_or_default();
        Metadata {
            filter_metadata: HashMap::from([(SUBSET_NAMESPACE.to_owned(), Struct { fields })]),
            ..Default::default()
        }
    }

    fn list(items: &[&str]) -> Kind {
        let mut values: Vec<Value> = items
            .iter()
            .map(|s| Value {
                kind: Some(Kind::StringValue((*s).to_owned())),
            })
            .collect();
        values.push(Value {
            kind: Some(Kind::NumberValue(1.0)),
        });
        Kind::ListValue(ListValue { values })
    }

    #[test]
    fn the_hint_restricts_by_ip_and_its_absence_does_not() {
        let a = Replica::new("a", "10.0.0.1:8000", vec![]);
        let b = Replica::new("b", "10.0.0.2:8000", vec![]);
        assert_eq!(Subset::from_metadata(None), None);
        assert_eq!(
            Subset::from_metadata(Some(&Metadata::default())),
            None,
            "no namespace: nothing said"
        );
        assert_eq!(
            Subset::from_metadata(Some(&metadata(None))),
            Some(Subset::Any)
        );
        let not_a_list = metadata(Some(Kind::StringValue("10.0.0.1:8000".into())));
        assert_eq!(Subset::from_metadata(Some(&not_a_list)), Some(Subset::Any));
        let subset =
            Subset::from_metadata(Some(&metadata(Some(list(&["10.0.0.2:9999"]))))).unwrap();
        assert!(!subset.admits(&a));
        assert!(subset.admits(&b), "the IP decides, not the port");
        let empty = Subset::from_metadata(Some(&metadata(Some(list(&[]))))).unwrap();
        assert!(!empty.admits(&a) && !empty.admits(&b));
        assert!(Subset::Any.admits(&a));
    }

    #[test]
    fn hosts_are_read_from_v4_v6_and_bare_addresses() {
        assert_eq!(host("10.0.0.1:8000"), "10.0.0.1");
        assert_eq!(host("[fd00::1]:8000"), "fd00::1");
        assert_eq!(host("fd00::1"), "fd00::1");
        assert_eq!(host("10.0.0.1"), "10.0.0.1");
    }
}
