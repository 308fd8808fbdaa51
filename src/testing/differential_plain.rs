//! The differential test's plain-command steps (see `differential.rs`): mostly the forms
//! redfence's plain link sends to a server of the case's profile (`SET k t NX PX ttl` and `SET
//! k t NX GET PX ttl` everywhere; `SET k t IFEQ t PX ttl`, and `DELIFEQ k t` on Valkey 9 or
//! `DELEX k IFEQ t` on Redis 8), else any form of `SET`'s conditions, `DELIFEQ` and `DELEX`,
//! right or wrong, on any profile (a server without them answers its own errors).

use super::differential_data::LOCKS;
use super::differential_gen::Gen;
use super::profile::Profile;

impl Gen {
    /// A plain command on a lock key (or any key), with one of the batch script's tokens.
    pub(super) fn plain_command(&mut self) -> Vec<String> {
        let key = if self.one_in(5) {
            self.key()
        } else {
            self.pick(LOCKS).to_owned()
        };
        let token = self.pick(&["t1", "t2", "t3"]).to_owned();
        let ttl = self.pick(&["60000", "60000", "30000"]).to_owned();
        let words: Vec<&str> = if self.one_in(4) {
            self.any_form()
        } else {
            match (self.below(4), self.profile) {
                (0, _) => vec!["SET", "{k}", "{t}", "NX", "PX", "{ttl}"],
                (1, _) => vec!["SET", "{k}", "{t}", "NX", "GET", "PX", "{ttl}"],
                (2, _) => vec!["SET", "{k}", "{t}", "IFEQ", "{t}", "PX", "{ttl}"],
                (_, Profile::Redis8) => vec!["DELEX", "{k}", "IFEQ", "{t}"],
                _ => vec!["DELIFEQ", "{k}", "{t}"],
            }
        };
        words
            .into_iter()
            .map(|word| match word {
                "{k}" => key.clone(),
                "{t}" => token.clone(),
                "{ttl}" => ttl.clone(),
                other => other.to_owned(),
            })
            .collect()
    }

    /// Any form of `SET` with conditions, `DELIFEQ` or `DELEX` (`{k}` the key, `{t}` a token,
    /// `{ttl}` a TTL).
    fn any_form(&mut self) -> Vec<&'static str> {
        match self.below(4) {
            0 | 1 => {
                let mut words = vec!["SET", "{k}", self.pick(&["v", "{t}"])];
                let options: &[&[&str]] = &[
                    &["IFEQ", "{t}"],
                    &["IFEQ", "t1"],
                    &["ifeq", "v"],
                    &["IFNE", "{t}"],
                    &["NX"],
                    &["XX"],
                    &["GET"],
                    &["KEEPTTL"],
                    &["PX", "{ttl}"],
                    &["PX", "0"],
                    &["IFDEQ", "zz"],
                    &["IFDNE", "0123"],
                    &["IFEQ"],
                ];
                for _ in 0..1 + self.below(3) {
                    words.extend_from_slice(options[self.below(options.len())]);
                }
                // Redis 8.6.3 answers a malformed digest with GET twice (the old value, then
                // `ERR must be exactly 16 hexadecimal characters`), one reply too many: not sent.
                if words.iter().any(|w| w.starts_with("IFD")) {
                    words.retain(|w| *w != "GET");
                }
                words
            }
            2 => match self.below(3) {
                0 => vec!["DELIFEQ", "{k}"],
                1 => vec!["DELIFEQ", "{k}", "{t}", "x"],
                _ => vec!["delifeq", "{k}", "v"],
            },
            _ => match self.below(8) {
                0 => vec!["DELEX", "{k}"],
                1 => vec!["DELEX", "{k}", "IFNE", "{t}"],
                2 => vec!["DELEX", "{k}", "ifeq", "{t}"],
                3 => vec!["DELEX", "{k}", "FOO", "{t}"],
                4 => vec!["DELEX", "{k}", "IFEQ"],
                5 => vec!["DELEX", "{k}", "IFDEQ", "zz"],
                6 => vec!["DELEX", "{k}", "IFEQ", "{t}", "x"],
                _ => vec!["DELEX", "{k}", "IFEQ", "v"],
            },
        }
    }
}
