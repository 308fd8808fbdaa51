//! [`ResourceType`]: which *type* of resource a lock is, for metric labels that stay bounded.

use std::fmt;
use std::sync::Arc;

/// How a resource name maps to its *type*, the `type` label of redfence's metrics (feature
/// `metrics`): a label must take few values, and resource names are unbounded, so a metric
/// is labelled with the type (`invoice`), never the name (`invoice:4821`).
///
/// The default is [`prefix_before(':')`](Self::prefix_before): `invoice:4821` is of type
/// `invoice`, `election:scheduler` of type `election`. The cardinality rules, whatever the
/// rule:
///
/// - a name the rule gives no type (no separator, or an empty prefix) is of type
///   [`OTHER`](Self::OTHER);
/// - a type longer than [`MAX_LEN`](Self::MAX_LEN) bytes is cut there (at a character
///   boundary);
/// - a lock over several resources is of their common type, or [`MIXED`](Self::MIXED) when
///   their types differ ([`of_all`](Self::of_all));
/// - at most [`MAX_TYPES`](Self::MAX_TYPES) distinct types are ever used as labels in one
///   process; the types seen after that are reported as [`OTHER`](Self::OTHER).
///
/// ```
/// use redfence::ResourceType;
///
/// let by_colon = ResourceType::default();
/// assert_eq!(by_colon.of("invoice:4821"), "invoice");
/// assert_eq!(by_colon.of("nightly-report"), ResourceType::OTHER);
/// assert_eq!(by_colon.of_all(&["account:1", "account:2"]), "account");
/// assert_eq!(by_colon.of_all(&["account:1", "invoice:2"]), ResourceType::MIXED);
///
/// // Names like `tenant-7/invoice/4821`: the second path segment.
/// let by_path = ResourceType::custom(|name| name.split('/').nth(1));
/// assert_eq!(by_path.of("tenant-7/invoice/4821"), "invoice");
/// ```
#[derive(Clone)]
pub struct ResourceType {
    rule: Rule,
}

#[derive(Clone)]
enum Rule {
    /// The prefix before the first separator.
    Before(char),
    /// The caller's function.
    Custom(Arc<CustomRule>),
}

type CustomRule = dyn Fn(&str) -> Option<&str> + Send + Sync;

impl ResourceType {
    /// The longest type label, in bytes: a longer type is cut to this length.
    pub const MAX_LEN: usize = 32;
    /// The most distinct type labels one process reports; later types are [`OTHER`](Self::OTHER).
    pub const MAX_TYPES: usize = 100;
    /// The type of a name the rule gives none, and of every type past [`MAX_TYPES`](Self::MAX_TYPES).
    pub const OTHER: &'static str = "other";
    /// The type of a lock over resources of different types.
    pub const MIXED: &'static str = "mixed";

    /// The type is the part of the name before the first `separator`: with `':'` (the
    /// default), `invoice:4821` is `invoice`. A name without the separator, or that starts
    /// with it, is of type [`OTHER`](Self::OTHER).
    pub fn prefix_before(separator: char) -> Self {
        ResourceType {
            rule: Rule::Before(separator),
        }
    }

    /// The type is what `rule` returns for the name, a part of it; `None` (or an empty
    /// string) means [`OTHER`](Self::OTHER). Length and count are capped as for every rule.
    /// Return a part that names a *kind* of resource, never an ID: the type is a label.
    pub fn custom<F>(rule: F) -> Self
    where
        F: Fn(&str) -> Option<&str> + Send + Sync + 'static,
    {
        ResourceType {
            rule: Rule::Custom(Arc::new(rule)),
        }
    }

    /// The type of one resource name, cut to [`MAX_LEN`](Self::MAX_LEN) bytes (the
    /// [`MAX_TYPES`](Self::MAX_TYPES) cap applies when it is used as a label, not here).
    pub fn of<'a>(&self, resource: &'a str) -> &'a str {
        let found = match &self.rule {
            Rule::Before(separator) => resource.split_once(*separator).map(|(ty, _)| ty),
            Rule::Custom(rule) => rule(resource),
        };
        match found {
            Some(ty) if !ty.is_empty() => cut(ty, Self::MAX_LEN),
            _ => Self::OTHER,
        }
    }

    /// The type of a lock over `resources`: their common type, [`MIXED`](Self::MIXED) when
    /// they differ, [`OTHER`](Self::OTHER) for none.
    pub fn of_all<'a>(&self, resources: &'a [impl AsRef<str>]) -> &'a str {
        let mut types = resources.iter().map(|name| self.of(name.as_ref()));
        let Some(first) = types.next() else {
            return Self::OTHER;
        };
        if types.all(|ty| ty == first) {
            first
        } else {
            Self::MIXED
        }
    }
}

impl Default for ResourceType {
    /// [`prefix_before(':')`](Self::prefix_before).
    fn default() -> Self {
        Self::prefix_before(':')
    }
}

impl fmt::Debug for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Rule::Before(separator) => f
                .debug_tuple("ResourceType::prefix_before")
                .field(separator)
                .finish(),
            Rule::Custom(_) => f.write_str("ResourceType::custom(..)"),
        }
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let end = (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_prefix_before_the_first_colon() {
        let rule = ResourceType::default();
        assert_eq!(rule.of("invoice:4821"), "invoice");
        assert_eq!(rule.of("invoice:4821:line:3"), "invoice");
        assert_eq!(rule.of("election:scheduler"), "election");
        // No separator, or nothing before it: no type, never the name itself.
        assert_eq!(rule.of("4821"), ResourceType::OTHER);
        assert_eq!(rule.of(":4821"), ResourceType::OTHER);
        assert_eq!(ResourceType::prefix_before('/').of("jobs/7"), "jobs");
    }

    #[test]
    fn types_are_cut_to_the_length_cap_at_a_character_boundary() {
        let rule = ResourceType::default();
        let long = format!("{}:1", "t".repeat(100));
        assert_eq!(rule.of(&long), "t".repeat(ResourceType::MAX_LEN));
        // 31 ASCII bytes then a 2-byte character straddling the cap.
        let straddling = format!("{}é:1", "a".repeat(31));
        assert_eq!(rule.of(&straddling), "a".repeat(31));
        assert_eq!(cut("ééé", 3), "é");
    }

    #[test]
    fn a_lock_is_of_its_resources_common_type_or_mixed() {
        let rule = ResourceType::default();
        assert_eq!(rule.of_all(&["account:1", "account:2"]), "account");
        assert_eq!(
            rule.of_all(&["account:1", "invoice:2"]),
            ResourceType::MIXED
        );
        assert_eq!(rule.of_all(&["a", "b"]), ResourceType::OTHER);
        let none: [&str; 0] = [];
        assert_eq!(rule.of_all(&none), ResourceType::OTHER);
    }

    #[test]
    fn a_custom_rule_may_decline() {
        let rule = ResourceType::custom(|name| name.split('/').nth(1));
        assert_eq!(rule.of("tenant-7/invoice/4821"), "invoice");
        assert_eq!(rule.of("tenant-7"), ResourceType::OTHER);
        assert_eq!(rule.of("tenant-7//x"), ResourceType::OTHER);
        assert_eq!(format!("{rule:?}"), "ResourceType::custom(..)");
    }
}
