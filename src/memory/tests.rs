use super::*;
use crate::clock;

const S: Duration = Duration::from_secs(1);
const PERIOD: Duration = Duration::from_secs(60);
/// A server clock reading, in ms since the epoch.
const NOW_MS: u64 = 1_800_000_000_000;

/// A reading of a marker `id` made `age` ago, taken at `at`, with `roster`.
fn reading(id: &str, age: Duration, at: Instant, roster: &[(&str, Entry)]) -> Reading {
    Reading {
        marker: Marker {
            id: id.into(),
            made_ms: NOW_MS - age.as_millis() as u64,
        },
        now_ms: NOW_MS,
        uptime: Some(3600 * S),
        roster: roster
            .iter()
            .map(|(name, entry)| ((*name).to_owned(), entry.clone()))
            .collect(),
        at,
    }
}

/// A roster entry for marker `id`, first seen `age` ago.
fn entry(id: &str, age: Duration, replaced: bool) -> Entry {
    Entry {
        id: id.into(),
        first_seen_ms: NOW_MS - age.as_millis() as u64,
        replaced,
    }
}

/// A voter never read, with no reading of it under way.
const UNREAD: Peer<'static> = Peer::Unread { pending: false };

/// The verdict alone.
fn judge(name: &str, me: &Reading, peers: &[Peer<'_>], period: Duration) -> Verdict {
    super::judge(name, me, peers, period).0
}

fn until(verdict: Verdict, at: Instant) -> Duration {
    match verdict {
        Verdict::Until(until) => until - at,
        other => panic!("not quarantined: {other:?}"),
    }
}

#[test]
fn markers_and_entries_parse_as_the_script_stores_them() {
    assert_eq!(
        Marker::parse("ab12|1800000000000"),
        Some(Marker {
            id: "ab12".into(),
            made_ms: NOW_MS
        })
    );
    assert_eq!(Marker::parse("ab12"), None);
    assert_eq!(Marker::parse("ab12|x"), None);
    assert_eq!(
        Entry::parse("ab12|1800000000000|1"),
        Some(entry("ab12", Duration::ZERO, true))
    );
    assert_eq!(
        Entry::parse("ab12|1800000000000|0"),
        Some(entry("ab12", Duration::ZERO, false))
    );
    assert_eq!(Entry::parse("ab12|1800000000000|2"), None);
    assert_eq!(Entry::parse("1800000000000|0"), None);
}

#[test]
fn a_brand_new_voter_set_counts_once_every_roster_is_read() {
    let at = clock::now();
    // Three fresh markers, no roster anywhere: nothing was ever locked here.
    let a = reading("a", S, at, &[]);
    let b = reading("b", S, at, &[]);
    let c = reading("c", S, at, &[]);
    assert_eq!(
        judge("A", &a, &[Peer::Read(&b), Peer::Read(&c)], PERIOD),
        Verdict::Counts
    );
    // While C is unread, A's young marker is unsettled: C might remember another one.
    assert_eq!(
        judge("A", &a, &[Peer::Read(&b), UNREAD], PERIOD),
        Verdict::Unsettled(at + PERIOD - S)
    );
    // An old marker needs no roster to count.
    let old = reading("a", 2 * PERIOD, at, &[]);
    assert_eq!(judge("A", &old, &[UNREAD, UNREAD], PERIOD), Verdict::Counts);
}

#[test]
fn a_peer_that_remembers_another_marker_quarantines_for_the_whole_period() {
    let at = clock::now();
    // A lost its memory: its marker is new, B's roster still names the old one.
    let a = reading("new", S, at, &[]);
    let b = reading(
        "b",
        PERIOD * 10,
        at,
        &[("A", entry("old", PERIOD * 10, false))],
    );
    let c = reading("c", PERIOD * 10, at, &[]);
    let verdict = judge("A", &a, &[Peer::Read(&b), Peer::Read(&c)], PERIOD);
    assert_eq!(until(verdict, at), PERIOD);
    // Even when A's own clock says its marker is old (a clock stepped forward).
    let stepped = reading("new", PERIOD * 2, at, &[]);
    let verdict = judge("A", &stepped, &[Peer::Read(&b), Peer::Read(&c)], PERIOD);
    assert_eq!(until(verdict, at), PERIOD);
}

#[test]
fn a_replaced_marker_ages_by_the_least_of_every_clock() {
    let at = clock::now();
    // The replacement was recorded 40 s ago on B and 10 s ago on C (C's clock is behind, or
    // its roster was written later): the youngest age, 10 s, rules.
    let a = reading("new", 50 * S, at, &[]);
    let b = reading("b", PERIOD * 10, at, &[("A", entry("new", 40 * S, true))]);
    let c = reading("c", PERIOD * 10, at, &[("A", entry("new", 10 * S, true))]);
    let verdict = judge("A", &a, &[Peer::Read(&b), Peer::Read(&c)], PERIOD);
    assert_eq!(until(verdict, at), 50 * S);
    // A's own clock can hold it back too: stepped back, its marker looks 5 s old.
    let a = reading("new", 5 * S, at, &[]);
    let verdict = judge("A", &a, &[Peer::Read(&b), Peer::Read(&c)], PERIOD);
    assert_eq!(until(verdict, at), 55 * S);
    // Once every clock says the period passed, it counts.
    let a = reading("new", 2 * PERIOD, at, &[]);
    let b = reading(
        "b",
        PERIOD * 10,
        at,
        &[("A", entry("new", 2 * PERIOD, true))],
    );
    let verdict = judge("A", &a, &[Peer::Read(&b), UNREAD], PERIOD);
    assert_eq!(verdict.at(at), Standing::Counts);
}

#[test]
fn a_first_seen_marker_is_no_replacement() {
    let at = clock::now();
    // B's roster saw A's marker first 5 s ago, replacing nothing (a new voter set): counts.
    let a = reading("a", 5 * S, at, &[]);
    let b = reading("b", 5 * S, at, &[("A", entry("a", 5 * S, false))]);
    assert_eq!(judge("A", &a, &[Peer::Read(&b)], PERIOD), Verdict::Counts);
}

#[test]
fn a_reloaded_memory_is_quarantined_until_its_uptime_is_the_period() {
    let at = clock::now();
    // The marker is an hour old, the server started 20 s ago: reloaded from a snapshot.
    let mut a = reading("a", 3600 * S, at, &[]);
    a.uptime = Some(20 * S);
    let verdict = judge("A", &a, &[UNREAD], PERIOD);
    assert_eq!(until(verdict, at), 40 * S);
    // A marker made after the start (within the uptime, whole seconds allowed for) is not.
    let mut a = reading("a", 20 * S, at, &[]);
    a.uptime = Some(20 * S);
    assert_eq!(
        judge("A", &a, &[Peer::Read(&reading("b", S, at, &[]))], PERIOD),
        Verdict::Counts
    );
    // A long uptime: whatever was reloaded is older than the period.
    let mut a = reading("a", 3600 * S, at, &[]);
    a.uptime = Some(61 * S);
    assert_eq!(judge("A", &a, &[UNREAD], PERIOD), Verdict::Counts);
}

#[test]
fn the_book_judges_a_voter_by_what_the_others_remember() {
    let (book, [a, b, c]) = book_of(["A", "B", "C"]);
    let at = clock::now();
    // A answers first, young: unsettled until B and C are read.
    book.record(a, reading("a2", S, at, &[]));
    assert!(matches!(book.standing(a), Standing::Unsettled(_)));
    assert_eq!(
        book.peers_of(b),
        vec![
            ("A".to_owned(), "a2".to_owned()),
            ("C".to_owned(), String::new())
        ]
    );
    book.record(
        b,
        reading("b", PERIOD * 10, at, &[("A", entry("a1", PERIOD, false))]),
    );
    assert!(matches!(book.standing(a), Standing::Quarantined(_)));
    assert!(
        book.has_news_for(b),
        "B's roster names an old marker of A's"
    );
    book.record(c, reading("c", PERIOD * 10, at, &[]));
    assert!(matches!(book.standing(a), Standing::Quarantined(_)));
    assert_eq!(book.standing(b), Standing::Counts);
    assert_eq!(book.marker(a).as_deref(), Some("a2"));
    // A voter whose memory cannot be read is waited for by none.
    let (book, [a, b]) = book_of(["A", "B"]);
    book.record(a, reading("a", S, at, &[]));
    assert!(matches!(book.standing(a), Standing::Unsettled(_)));
    book.unreadable(b);
    assert_eq!(book.standing(a), Standing::Counts);
    assert_eq!(book.standing(b), Standing::Counts);
}

#[test]
fn standings_combine_to_the_stricter() {
    use Standing::{Counts, Quarantined, Unsettled};
    assert_eq!(Counts.and(Counts), Counts);
    assert_eq!(Counts.and(Unsettled(S)), Unsettled(S));
    assert_eq!(Unsettled(2 * S).and(Quarantined(S)), Quarantined(S));
    assert_eq!(Quarantined(S).and(Quarantined(3 * S)), Quarantined(3 * S));
    assert_eq!(Unsettled(S).and(Unsettled(3 * S)), Unsettled(3 * S));
}

#[test]
fn a_roster_that_was_itself_new_does_not_prolong_a_quarantine() {
    let at = clock::now();
    // A's replacement, recorded 50 s ago on B; C restarted since, and its new roster saw A's
    // marker first 1 s ago, replacing nothing: 10 s are left, not 59.
    let a = reading("new", 50 * S, at, &[]);
    let b = reading("b", PERIOD * 10, at, &[("A", entry("new", 50 * S, true))]);
    let c = reading("c", S, at, &[("A", entry("new", S, false))]);
    let verdict = judge("A", &a, &[Peer::Read(&b), Peer::Read(&c)], PERIOD);
    assert_eq!(until(verdict, at), 10 * S);
}

#[test]
fn a_replacement_is_spread_to_the_rosters_that_saw_the_marker_first() {
    let (book, [a, b, c]) = book_of(["A", "B", "C"]);
    let at = clock::now();
    // A and B lost their memory together; C remembers both old markers. B's new roster saw
    // A's new marker first, replacing nothing.
    book.record(
        c,
        reading(
            "c",
            PERIOD * 10,
            at,
            &[
                ("A", entry("a1", PERIOD, false)),
                ("B", entry("b1", PERIOD, false)),
            ],
        ),
    );
    book.record(a, reading("a2", S, at, &[]));
    book.record(b, reading("b2", S, at, &[("A", entry("a2", S, false))]));
    assert!(matches!(book.standing(a), Standing::Quarantined(_)));
    // B's roster is told that A's marker replaced another, and how long ago by the verdict
    // (C names A's old marker: no longer than it was read, 0 ms): if C lost its memory next,
    // B's roster would still say so.
    assert!(book.has_news_for(b));
    let told = book.peers_of(b);
    assert!(
        told.contains(&("A".to_owned(), "!0|a2".to_owned())),
        "{told:?}"
    );
    // Once B's roster says it, there is no more news for B about A.
    book.record(
        b,
        reading(
            "b2",
            S,
            at,
            &[("A", entry("a2", S, true)), ("C", entry("c", S, false))],
        ),
    );
    assert!(!book.has_news_for(b));
    // A voter that counts is not marked.
    let told = book.peers_of(a);
    assert!(told.contains(&("C".to_owned(), "c".to_owned())), "{told:?}");
}

#[test]
fn a_young_voter_waits_for_a_reading_under_way_and_is_quarantined_if_it_is_still_so() {
    let at = clock::now();
    let a = reading("a", S, at, &[]);
    // B's reading is under way (a first contact slower than the node timeout): pending.
    assert_eq!(
        judge("A", &a, &[Peer::Unread { pending: true }, UNREAD], PERIOD),
        Verdict::Pending(at + PERIOD - S)
    );
    let (book, [a, b]) = book_of(["A", "B"]);
    book.record(a, reading("a", S, at, &[]));
    assert!(matches!(book.standing(a), Standing::Unsettled(_)));
    book.reading(b, true);
    assert!(matches!(book.standing(a), Standing::Pending(_)));
    // B's reading failed (down): unsettled again, counted once every voter answered.
    book.reading(b, false);
    assert!(matches!(book.standing(a), Standing::Unsettled(_)));
    // Pending is stricter than unsettled, looser than quarantined.
    assert_eq!(
        Standing::Unsettled(S).and(Standing::Pending(S)),
        Standing::Pending(S)
    );
    assert_eq!(
        Standing::Pending(S).and(Standing::Quarantined(S)),
        Standing::Quarantined(S)
    );
}

/// A book of `voters`, registered in this order, and their indexes.
fn book_of<const N: usize>(voters: [&str; N]) -> (MemoryBook, [usize; N]) {
    let book = MemoryBook::new(PERIOD);
    let indexes = voters.map(|voter| book.register(voter).0);
    (book, indexes)
}
