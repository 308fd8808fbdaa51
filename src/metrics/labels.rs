//! The `type` label of a lock or a fenced write: a [`ResourceType`] applied, then interned in
//! a process-wide set of at most [`ResourceType::MAX_TYPES`] labels.

#[cfg(feature = "metrics")]
use std::collections::HashSet;
#[cfg(feature = "metrics")]
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use crate::resource_type::ResourceType;
#[cfg(feature = "metrics")]
use crate::resource_type::cut;

/// The `type` label of one lock or one fenced write. Without the `metrics` feature it holds
/// nothing and costs nothing.
#[derive(Clone, Debug)]
pub(crate) struct TypeLabel {
    #[cfg(feature = "metrics")]
    name: Arc<str>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl TypeLabel {
    /// The type of a lock over `resources` ([`ResourceType::of_all`]).
    pub(crate) fn of_lock(rule: &ResourceType, resources: &[String]) -> Self {
        TypeLabel {
            #[cfg(feature = "metrics")]
            name: LABELS.intern(rule.of_all(resources)),
        }
    }

    /// A type given as is (a resource's type, a table name), cut to
    /// [`ResourceType::MAX_LEN`]; empty is [`ResourceType::OTHER`].
    pub(crate) fn of_name(name: &str) -> Self {
        TypeLabel {
            #[cfg(feature = "metrics")]
            name: LABELS.intern(match cut(name, ResourceType::MAX_LEN) {
                "" => ResourceType::OTHER,
                name => name,
            }),
        }
    }

    /// [`ResourceType::OTHER`]: for a request too malformed to have a type.
    pub(crate) fn other() -> Self {
        TypeLabel {
            #[cfg(feature = "metrics")]
            name: LABELS.intern(ResourceType::OTHER),
        }
    }

    /// The label's value, to pass to the `metrics` macros.
    #[cfg(feature = "metrics")]
    pub(crate) fn value(&self) -> Arc<str> {
        Arc::clone(&self.name)
    }
}

/// Every type label this process has used.
#[cfg(feature = "metrics")]
static LABELS: LazyLock<Labels> = LazyLock::new(|| Labels::new(ResourceType::MAX_TYPES));

/// A set of at most `max` interned labels; one asked for when it is full is `other`.
#[cfg(feature = "metrics")]
pub(super) struct Labels {
    seen: RwLock<HashSet<Arc<str>>>,
    max: usize,
    other: Arc<str>,
}

#[cfg(feature = "metrics")]
impl Labels {
    pub(super) fn new(max: usize) -> Self {
        Labels {
            seen: RwLock::new(HashSet::new()),
            max,
            other: Arc::from(ResourceType::OTHER),
        }
    }

    /// The interned `name`, or `other` once `max` other names are in.
    pub(super) fn intern(&self, name: &str) -> Arc<str> {
        if name == ResourceType::OTHER {
            return Arc::clone(&self.other);
        }
        // A poisoned lock only means a panic elsewhere mid-insert: the set is still valid.
        if let Some(known) = self
            .seen
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return Arc::clone(known);
        }
        let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = seen.get(name) {
            return Arc::clone(known);
        }
        if seen.len() >= self.max {
            return Arc::clone(&self.other);
        }
        let label: Arc<str> = Arc::from(name);
        seen.insert(Arc::clone(&label));
        label
    }
}
