//! The differential test's random steps (see `differential.rs`): a tiny xorshift generator,
//! seeded per case, picks commands, ad hoc scripts and calls of redfence's scripts over a small
//! universe of keys, so that types collide and every branch of the scripts is reached.

use super::differential_data::{AD_HOC, LOCKS, RW, SCRIPTS, universe};
use super::lua::sha1_hex;
use super::profile::Profile;

/// How the two replies of a step are compared (after masking the server's time).
#[derive(Clone, Copy, Debug)]
pub(super) enum Compare {
    /// Equal.
    Exact,
    /// Equal but for integers within 100 (time left, in ms).
    Near,
    /// A `SCAN` reply: equal keys in any order.
    Scan,
    /// A `ZRANGE … WITHSCORES` reply: equal, but members whose scores come from the server's
    /// time (masked) in any order among themselves (one server's millisecond may tick between
    /// two members where the other's did not).
    Pairs,
}

/// A seeded source of steps.
pub(super) struct Gen {
    state: u64,
    /// What the case's steps are mostly: 0 a mix, 1 sorted sets, 2 batches, 3 strings and ad
    /// hoc scripts, 4 plain commands beside batches.
    focus: u64,
    /// The server the steps are for (the plain commands it has come up most).
    pub(super) profile: Profile,
}

impl Gen {
    /// The steps of case `seed` on a server of `profile`.
    pub(super) fn new(seed: u64, profile: Profile) -> Gen {
        let mut made = Gen {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            focus: seed % 5,
            profile,
        };
        for _ in 0..4 {
            made.next();
        }
        made
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n`.
    pub(super) fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap_or(1)).unwrap_or(0)
    }

    /// One of `items`.
    pub(super) fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// Whether a 1-in-`n` chance came up.
    pub(super) fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// How many steps this case has.
    pub(super) fn steps(&mut self) -> usize {
        8 + self.below(24)
    }

    /// A key of the universe, mostly one of those the scripts use.
    pub(super) fn key(&mut self) -> String {
        let keys = universe();
        if self.one_in(3) {
            keys[self.below(keys.len())].clone()
        } else {
            self.pick(&["a", "b", "z", "q", "rw", "a:redfence:queue"])
                .to_owned()
        }
    }

    /// Every ad hoc script on a string, a sorted set and a missing key (after a `SET` and a
    /// `ZADD` that make the first two): the sweep before the random cases.
    pub(super) fn sweep() -> Vec<Vec<Vec<u8>>> {
        let mut steps = vec![
            vec!["SET", "a", "12"],
            vec!["ZADD", "q", "1.5", "m1", "-2", "m2"],
        ];
        for source in AD_HOC {
            for key in ["a", "q", "n"] {
                steps.push(vec!["EVAL", source, "1", key, "m1"]);
            }
        }
        steps
            .into_iter()
            .map(|words| words.into_iter().map(|w| w.as_bytes().to_vec()).collect())
            .collect()
    }

    /// The next step: a command and how to compare its replies.
    pub(super) fn step(&mut self) -> (Vec<Vec<u8>>, Compare) {
        let roll = match self.focus {
            1 => 14 + self.below(6),
            2 => self.below(8),
            3 => 8 + self.below(6),
            4 => [self.below(6), 20, 20][self.below(3)],
            _ => self.below(23),
        };
        let (words, compare) = match roll {
            0..=5 => (self.batch(), Compare::Exact),
            6..=7 => self.script(),
            8 => (self.ad_hoc(), Compare::Exact),
            9..=13 => self.string_command(),
            14..=19 => (self.zset_command(), Compare::Exact),
            _ => (self.plain_command(), Compare::Exact),
        };
        (words.into_iter().map(String::into_bytes).collect(), compare)
    }

    /// `EVALSHA` of `name`'s script with `keys` and `argv`.
    fn evalsha(name: &str, keys: &[String], argv: &[String]) -> Vec<String> {
        let source = SCRIPTS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(&b""[..], |s| s.1);
        let mut words = vec![
            "EVALSHA".to_owned(),
            sha1_hex(source),
            keys.len().to_string(),
        ];
        words.extend(keys.iter().cloned());
        words.extend(argv.iter().cloned());
        words
    }

    /// A `batch.lua` call of one to four operations of any kind.
    fn batch(&mut self) -> Vec<String> {
        let (mut keys, mut argv) = (Vec::new(), Vec::new());
        if self.one_in(8) {
            argv.push("-".to_owned());
        }
        let tokens = ["t1", "t2", "t3"];
        let ttls = ["5000", "60000", "5000", "0", "x"];
        for _ in 0..1 + self.below(4) {
            let kind = self.pick(&[
                "a", "a", "a", "e", "E", "r", "r", "f", "f", "l", "R", "n", "m", "ra", "re", "rr",
                "wa", "we", "wr", "wl",
            ]);
            if kind == "m" {
                keys.push("m".to_owned());
                argv.extend(["m", "", "0", "1"].map(str::to_owned));
                continue;
            }
            let token = self.pick(&tokens).to_owned();
            let ttl = if self.one_in(6) {
                self.pick(&ttls)
            } else {
                "60000"
            }
            .to_owned();
            if kind.len() == 2 {
                keys.extend(RW.iter().map(|k| (*k).to_owned()));
                let waiter = self.pick(&["", "w1", "w2"]).to_owned();
                let wait = self.pick(&["0", "5000"]).to_owned();
                argv.extend([kind.to_owned(), token, ttl, "3".to_owned(), waiter, wait]);
                continue;
            }
            let count = if self.one_in(4) { 2 } else { 1 };
            for _ in 0..count {
                keys.push(self.pick(LOCKS).to_owned());
            }
            argv.extend([kind.to_owned(), token, ttl, count.to_string()]);
            if matches!(kind, "f" | "l" | "R") {
                let waiter = self.pick(&["w1", "w2", "w3"]).to_owned();
                let ticket = (1 + self.below(4)).to_string();
                let lease = self.pick(&["5000", "20000"]).to_owned();
                argv.extend([waiter, ticket, lease]);
            }
        }
        Gen::evalsha("batch", &keys, &argv)
    }

    /// A call of one of redfence's other scripts.
    fn script(&mut self) -> (Vec<String>, Compare) {
        let k = |g: &mut Gen| g.key();
        let s = |v: &[&str]| v.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        match self.below(9) {
            0 => (
                Gen::evalsha("inspect", &[k(self), k(self)], &[]),
                Compare::Near,
            ),
            1 => (
                Gen::evalsha("inspect", &[k(self)], &s(&["release"])),
                Compare::Near,
            ),
            2 => {
                let value = self.pick(&["3", "4"]);
                (
                    Gen::evalsha("claim", &[k(self)], &s(&[value, "60000"])),
                    Compare::Exact,
                )
            }
            3 => {
                let argv = s(&[self.pick(&["t1", "t2"]), self.pick(&["", "v"]), "60000"]);
                let keys = [self.pick(LOCKS).to_owned(), "n".to_owned()];
                (Gen::evalsha("write_if_held", &keys, &argv), Compare::Exact)
            }
            4 => (Gen::evalsha("rwlock_inspect", &s(&RW), &[]), Compare::Near),
            5 => {
                let replace = self.pick(&["", "id1"]);
                let seen = self.pick(&["", "id2", "!500|id2", "id3"]);
                let argv = s(&[self.pick(&["id1", "id4"]), replace, seen]);
                (
                    Gen::evalsha("memory", &s(&["m", "r:b"]), &argv),
                    Compare::Exact,
                )
            }
            6 => {
                let argv = s(&[self.pick(&["1", "2", "1"]), self.pick(&["2", "1"])]);
                let keys = s(&[self.pick(&["f:1", "a"]), "f:2"]);
                (Gen::evalsha("next_fences", &keys, &argv), Compare::Exact)
            }
            7 => {
                let argv = s(&[self.pick(&["2", "3"]), self.pick(&["0", "7"])]);
                (
                    Gen::evalsha("init_stripes", &s(&["s", "s:0", "s:1"]), &argv),
                    Compare::Exact,
                )
            }
            _ => {
                let argv = s(&["2", "1", "2", "2", "2", "3", self.pick(&["1", "9"])]);
                (
                    Gen::evalsha("next_ranges", &s(&["s", "s:0", "s:1"]), &argv),
                    Compare::Exact,
                )
            }
        }
    }

    /// `EVAL` of an ad hoc script (or `EVALSHA` of one never loaded).
    fn ad_hoc(&mut self) -> Vec<String> {
        if self.one_in(12) {
            return ["EVALSHA", "ffffffffffffffffffffffffffffffffffffffff", "0"]
                .map(str::to_owned)
                .to_vec();
        }
        let source = self.pick(AD_HOC).to_owned();
        let key = self.key();
        let arg = self.pick(&["m1", "m2"]).to_owned();
        vec!["EVAL".to_owned(), source, "1".to_owned(), key, arg]
    }

    /// A string or generic command.
    fn string_command(&mut self) -> (Vec<String>, Compare) {
        let key = self.key();
        let other = self.key();
        let value = self.pick(&["v", "t1", "12", "", "-3", "007"]).to_owned();
        let mut w: Vec<String> = match self.below(15) {
            0..=2 => {
                let mut w = vec!["SET".to_owned(), key, value];
                for _ in 0..self.below(3) {
                    w.push(
                        self.pick(&["NX", "XX", "GET", "nx", "KEEPTTL", "PX"])
                            .to_owned(),
                    );
                    if w.last().is_some_and(|o| o == "PX") {
                        w.push(self.pick(&["60000", "30000", "0", "-5", "x"]).to_owned());
                    }
                }
                w
            }
            3 => vec!["GET".to_owned(), key],
            4 => vec!["DEL".to_owned(), key, other],
            5 => vec!["EXISTS".to_owned(), key, other],
            6 => {
                let ms = self.pick(&["60000", "30000", "0", "-1", "x"]).to_owned();
                let mut w = vec!["PEXPIRE".to_owned(), key, ms];
                if self.one_in(2) {
                    w.push(
                        self.pick(&["NX", "XX", "GT", "LT", "GT", "LT", "zz"])
                            .to_owned(),
                    );
                }
                w
            }
            7 => {
                let (a, b) = (
                    self.pick(&["0", "1", "-1", "-3", "5"]),
                    self.pick(&["0", "2", "-1", "-9", "x"]),
                );
                vec!["GETRANGE".to_owned(), key, a.to_owned(), b.to_owned()]
            }
            8 => vec!["TYPE".to_owned(), key],
            9 => vec!["STRLEN".to_owned(), key],
            10 => vec!["INCR".to_owned(), key],
            11 => {
                let by = self
                    .pick(&["5", "-2", "x", "9223372036854775807"])
                    .to_owned();
                vec!["INCRBY".to_owned(), key, by]
            }
            12 => vec!["MGET".to_owned(), key, other],
            13 if self.one_in(2) => vec!["PUBLISH".to_owned(), key, value],
            13 => {
                let pattern = self.pick(&["*", "a*", "*:redfence:*", "?", "[ab]", "rw:[^r]*"]);
                let mut w = ["SCAN", "0", "COUNT", "1000"].map(str::to_owned).to_vec();
                w.extend(["MATCH".to_owned(), pattern.to_owned()]);
                if self.one_in(3) {
                    w.extend(["TYPE".to_owned(), self.pick(&["string", "zset"]).to_owned()]);
                }
                return (w, Compare::Scan);
            }
            _ => match self.below(4) {
                0 => vec!["NOSUCH".to_owned(), key, value],
                1 => vec!["GET".to_owned()],
                2 => vec!["set".to_owned(), key],
                _ => vec!["DEL".to_owned()],
            },
        };
        let compare = if w[0] == "PTTL" {
            Compare::Near
        } else {
            Compare::Exact
        };
        if self.one_in(15) {
            w = vec!["PTTL".to_owned(), self.key()];
            return (w, Compare::Near);
        }
        (w, compare)
    }

    /// A sorted-set command.
    fn zset_command(&mut self) -> Vec<String> {
        let key = self
            .pick(&["q", "z", "a", "q", "q", "z", "a:redfence:queue"])
            .to_owned();
        let member = |g: &mut Gen| g.pick(&["m1", "m2", "m2", "w1"]).to_owned();
        let score = |g: &mut Gen| {
            g.pick(&["1", "2.5", "-3", "0", "1e3", "0.1", "inf", "-inf", "x", "1"])
                .to_owned()
        };
        let bound = |g: &mut Gen| {
            g.pick(&[
                "-inf", "+inf", "(1", "1", "2.5", "(2.5", "0", "(0", "x", "-3", "(-3", "(", "",
            ])
            .to_owned()
        };
        match self.below(10) {
            0..=2 => {
                let mut w = vec!["ZADD".to_owned(), key];
                for _ in 0..self.below(3) {
                    if self.one_in(2) {
                        w.push(
                            self.pick(&["NX", "XX", "CH", "GT", "LT", "INCR"])
                                .to_owned(),
                        );
                    }
                }
                let incr = w.iter().any(|o| o == "INCR") && !self.one_in(4);
                for _ in 0..if incr { 1 } else { 1 + self.below(3) } {
                    w.push(score(self));
                    w.push(member(self));
                }
                w
            }
            3 => {
                let mut w = vec!["ZRANGE".to_owned(), key];
                if self.one_in(3) {
                    w.extend([bound(self), bound(self), "BYSCORE".to_owned()]);
                } else {
                    let (a, b) = (
                        self.pick(&["0", "1", "-1", "-2"]),
                        self.pick(&["0", "-1", "5", "x"]),
                    );
                    w.extend([a.to_owned(), b.to_owned()]);
                }
                for _ in 0..self.below(3) {
                    w.push(self.pick(&["REV", "WITHSCORES", "LIMIT"]).to_owned());
                    if w.last().is_some_and(|o| o == "LIMIT") {
                        w.push(self.pick(&["0", "1", "-1"]).to_owned());
                        w.push(self.pick(&["1", "2", "-1", "0"]).to_owned());
                    }
                }
                w
            }
            4 => {
                let mut w = vec!["ZRANGEBYSCORE".to_owned(), key, bound(self), bound(self)];
                if self.one_in(2) {
                    w.push("WITHSCORES".to_owned());
                }
                if self.one_in(2) {
                    w.push("LIMIT".to_owned());
                    w.push(self.pick(&["0", "1", "-1", "5", "0"]).to_owned());
                    w.push(self.pick(&["1", "2", "-1", "0"]).to_owned());
                }
                w
            }
            5 => {
                let mut w = vec!["ZREM".to_owned(), key];
                for _ in 0..1 + self.below(2) {
                    w.push(member(self));
                }
                w
            }
            6 => vec!["ZREMRANGEBYSCORE".to_owned(), key, bound(self), bound(self)],
            7 | 8 => vec!["ZSCORE".to_owned(), key, member(self)],
            _ => vec!["ZCARD".to_owned(), key],
        }
    }
}
