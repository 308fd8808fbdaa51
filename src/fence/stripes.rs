//! [`Stripes`]: how a striped counter maps a resource to one of its S counters.
//!
//! A striped counter keeps S counters (rows, keys) instead of one per resource, and hands
//! out a **range** of tokens per batch: one update of a stripe issues the tokens of every
//! request of the batch on it. Tokens then stay greater than every earlier token *of the
//! same resource*, which is all fencing needs, as long as every client maps a resource to
//! the same stripe, hence a mapping fixed forever: FNV-1a (64-bit) of the name's UTF-8
//! bytes, modulo S.
//!
//! # Why the order holds
//!
//! A stripe's value is the largest token ever issued from it, written in the same atomic
//! update (script, statement) that issues them. A batch reads the current value of every
//! stripe it involves and issues tokens above the largest of them; a request whose
//! resources span several stripes gets one token above every one of them, and every one of
//! them is raised to at least that token in the same update. So a token exceeds every token
//! issued before it, by any committed update, for any resource on its stripes.
//!
//! A later holder of a resource asks for its token only after the earlier holder's was
//! committed: a lock carries a token only if the token arrived within the lock's validity
//! (otherwise the acquisition fails closed and the token is never used), and the next
//! holder's lock is granted only after that validity ended. So the later request is in an
//! update that starts after the earlier one committed, reads a stripe value at least the
//! earlier token, and issues a greater one.

/// The stripe count of a striped counter, and the fixed map from a resource name to its
/// stripe: FNV-1a (64-bit) of the name's UTF-8 bytes, modulo the count.
///
/// **Every client that shares a counter must use the same count**: with another count a
/// resource maps to another stripe, whose tokens are unrelated. The built-in counters record
/// the count in their store and refuse a client configured with another one.
///
/// ```
/// use redfence::fence::Stripes;
///
/// let stripes = Stripes::new(16).expect("1 to 1024");
/// assert!(stripes.of("invoice:4821") < 16);
/// assert_eq!(stripes.of("invoice:4821"), stripes.of("invoice:4821"));
/// assert_eq!(Stripes::new(0), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stripes(u32);

impl Stripes {
    /// The most stripes a counter may have.
    pub const MAX: u32 = 1024;

    /// 16 stripes: enough that concurrent clients' small batches rarely meet on one stripe,
    /// few enough that a busy batch updates at most 16 counters.
    pub const DEFAULT: Stripes = Stripes(16);

    /// `count` stripes, from 1 to [`MAX`](Self::MAX); `None` otherwise.
    pub const fn new(count: u32) -> Option<Stripes> {
        if count >= 1 && count <= Self::MAX {
            Some(Stripes(count))
        } else {
            None
        }
    }

    /// How many stripes.
    pub const fn count(self) -> u32 {
        self.0
    }

    /// The stripe of `resource`, in `0..count`: FNV-1a (64-bit) of its UTF-8 bytes, modulo
    /// the count. Fixed: it is part of every striped counter's stored format.
    pub fn of(self, resource: &str) -> u32 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let hash = resource
            .bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        // The remainder is below the count, a u32.
        u32::try_from(hash % u64::from(self.0)).unwrap_or(0)
    }

    /// The distinct stripes of a lock's resources, in increasing order.
    pub fn of_all(self, resources: &[String]) -> Vec<u32> {
        let mut stripes: Vec<u32> = resources.iter().map(|r| self.of(r)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
    }
}

impl Default for Stripes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_fnv1a_and_fixed() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; these values are the stored format.
        let one = Stripes::new(1).expect("one");
        assert_eq!(one.of("anything"), 0);
        let s = Stripes::new(1024).expect("1024");
        assert_eq!(u64::from(s.of("a")), 0xaf63_dc4c_8601_ec8c % 1024);
        assert_eq!(Stripes::new(1025), None);
        let sixteen = Stripes::DEFAULT;
        let names: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
        let all = sixteen.of_all(&names);
        assert!(
            all.len() > 8 && all.windows(2).all(|w| w[0] < w[1]),
            "{all:?}"
        );
    }
}
