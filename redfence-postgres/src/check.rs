//! [`FenceCheck`]: which fences a fenced write accepts.

/// Which fences the storage-side helpers ([`FencedUpdate`](crate::FencedUpdate),
/// [`FenceGuards`](crate::FenceGuards)) accept, compared with the last fence accepted for the
/// row or resource. Defaults to [`AllowOwnerRewrite`](Self::AllowOwnerRewrite).
///
/// Tokens are unique per acquisition of a resource, so a stale owner always holds a token *smaller* than
/// the owner that replaced it: rejecting smaller tokens is all that safety needs, and the
/// current owner may write as often as it likes with its one token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FenceCheck {
    /// Accept a fence greater than **or equal to** the last one accepted
    /// (`last_fence <= $fence`): the owner's own token again, so it can write several times
    /// per acquisition. Reject any smaller fence. The default.
    #[default]
    AllowOwnerRewrite,
    /// Accept only a fence strictly greater than the last one accepted
    /// (`last_fence < $fence`): each fence is accepted **once**, so a second write with the
    /// same lock is refused as stale. For writes that must happen at most once per
    /// acquisition.
    Strict,
}

impl FenceCheck {
    /// The SQL comparison that accepts a fence: `last_fence {op} $fence`.
    pub(crate) fn accepts_op(self) -> &'static str {
        match self {
            FenceCheck::AllowOwnerRewrite => "<=",
            FenceCheck::Strict => "<",
        }
    }

    /// Whether a fence `offered` is refused after `last` was accepted.
    pub(crate) fn refuses(self, offered: i64, last: i64) -> bool {
        match self {
            FenceCheck::AllowOwnerRewrite => offered < last,
            FenceCheck::Strict => offered <= last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_accepts_the_owners_own_fence_and_strict_does_not() {
        let default = FenceCheck::default();
        assert_eq!(default, FenceCheck::AllowOwnerRewrite);
        assert!(!default.refuses(5, 5));
        assert!(default.refuses(4, 5));
        assert!(!default.refuses(6, 5));
        assert!(FenceCheck::Strict.refuses(5, 5));
        assert!(FenceCheck::Strict.refuses(4, 5));
        assert!(!FenceCheck::Strict.refuses(6, 5));
    }
}
