//! The checker: a plain function over what was recorded and what the store
//! holds at the end. It knows nothing of the attack that produced them, so
//! the fault matrix's rows and the multi-process tests judge a run alike.

use super::record::{Call, Outcome, Record};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// How long before its handler call a run's lease may have begun: a
/// claimed event can wait for a free slot (claims run ahead of the slots)
/// before its call starts, and its lease counts from the claim.
pub const CLAIM_LEAD: Duration = Duration::from_secs(1);

/// One row of `events` as the store holds it after the scenario.
#[derive(Debug, Clone)]
pub struct Row {
    /// The event id.
    pub id: String,
    /// Its dedup key.
    pub dedup_key: String,
    /// Its topic.
    pub topic: String,
    /// Its ordering key, if any.
    pub key: Option<String>,
    /// `done`, `dead`, `pending`...
    pub status: String,
    /// Attempts made.
    pub attempts: i64,
    /// Attempts mailroom recorded as cut by its timeout: a success the
    /// handler side saw in such an attempt came too late to count, so the
    /// event was rightly run again.
    pub timed_out: Vec<i64>,
}

/// What the scenario promises about its events.
#[derive(Debug, Default, Clone)]
pub struct Expect {
    /// Topics in `sequential` mode (`on_dead = "block"`).
    pub sequential: HashSet<String>,
    /// Dedup keys of poison events: they must end `dead`, after exactly
    /// `dead_attempts` attempts. Every other event must end `done`, except
    /// those queued behind a dead head of a sequential key (`pending`).
    pub dead: HashSet<String>,
    /// How many attempts a poison event gets before it is dead.
    pub dead_attempts: i64,
    /// The lease of the scenario's topics. A completed event whose run
    /// starts again once that lease can have expired (a lease after its
    /// successful call began, less [`CLAIM_LEAD`]) was run again because
    /// the completion's commit came too late (at least once): counted as
    /// excused, never a failure, like a rerun after a disruption. `None`:
    /// only disruptions excuse a rerun. Two runs at once are always
    /// duplicates.
    pub lease: Option<Duration>,
}

/// What the checker found.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Distinct dedup keys acknowledged.
    pub acked: usize,
    /// Acked but not stored, or stored but not in its promised end state.
    pub lost: usize,
    /// Overlapping runs of one event, a completed event run again with no
    /// disruption in between, or two events for one dedup key.
    pub duplicates: usize,
    /// Sequential topics: a key's event started before its predecessor succeeded.
    pub order: usize,
    /// Late completions refused by their fencing token.
    pub fenced: usize,
    /// Completed events run again after a disruption or once the
    /// successful run's lease had expired (the at-least-once allowance,
    /// counted, not a failure).
    pub excused: usize,
    /// The first few findings, in words.
    pub findings: Vec<String>,
}

impl Verdict {
    fn note(&mut self, what: String) {
        if self.findings.len() < 8 {
            self.findings.push(what);
        }
    }
}

/// Checks `record` against the store's `rows` and the scenario's promises.
pub fn check(record: &Record, rows: &[Row], expect: &Expect) -> Verdict {
    let mut v = Verdict::default();
    let calls = calls_by_event(record);
    check_acks(record, rows, &mut v);
    check_end_states(record, rows, expect, &calls, &mut v);
    let none = Vec::new();
    let timed_out: HashMap<&str, &Vec<i64>> =
        rows.iter().map(|r| (r.id.as_str(), &r.timed_out)).collect();
    for (id, calls) in &calls {
        let cut = timed_out.get(id.as_str()).copied().unwrap_or(&none);
        check_runs(id, calls, cut, &record.disruptions, expect, &mut v);
    }
    check_order(record, rows, expect, &calls, &mut v);
    v.fenced = record
        .calls
        .iter()
        .filter(|c| c.outcome == Outcome::Fenced)
        .count();
    v
}

/// Each event's calls (fenced ones excluded: they changed nothing), by start.
fn calls_by_event(record: &Record) -> HashMap<String, Vec<Call>> {
    let mut by: HashMap<String, Vec<Call>> = HashMap::new();
    for c in record.calls.iter().filter(|c| c.outcome != Outcome::Fenced) {
        by.entry(c.event_id.clone()).or_default().push(c.clone());
    }
    for calls in by.values_mut() {
        calls.sort_by_key(|c| c.start);
    }
    by
}

/// Every acked event is stored, under one id per dedup key.
fn check_acks(record: &Record, rows: &[Row], v: &mut Verdict) {
    let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
    for a in &record.acks {
        ids.entry(&a.dedup_key).or_default().insert(&a.event_id);
    }
    v.acked = ids.len();
    let stored: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    for (dk, ids) in &ids {
        if ids.len() > 1 {
            v.duplicates += ids.len() - 1;
            v.note(format!("{dk}: acked with {} different ids", ids.len()));
        }
        for id in ids.iter().filter(|id| !stored.contains(*id)) {
            v.lost += 1;
            v.note(format!("{dk}: acked as {id}, not stored"));
        }
    }
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for r in rows {
        *per_key.entry(&r.dedup_key).or_default() += 1;
    }
    for (dk, n) in per_key.into_iter().filter(|(_, n)| *n > 1) {
        v.duplicates += n - 1;
        v.note(format!("{dk}: stored {n} times"));
    }
}

/// The end state each stored row was promised.
fn promised(record: &Record, rows: &[Row], expect: &Expect) -> HashMap<String, &'static str> {
    let by_id: HashMap<&str, &Row> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut out: HashMap<String, &'static str> = rows
        .iter()
        .map(|r| {
            let s = if expect.dead.contains(&r.dedup_key) {
                "dead"
            } else {
                "done"
            };
            (r.id.clone(), s)
        })
        .collect();
    // Behind a dead head, a sequential key stays blocked.
    for ids in arrival_by_key(record, rows, expect).values() {
        let mut blocked = false;
        for id in ids.values() {
            let Some(r) = by_id.get(id.as_str()) else {
                continue;
            };
            if blocked {
                out.insert(r.id.clone(), "pending");
            } else if expect.dead.contains(&r.dedup_key) {
                blocked = true;
            }
        }
    }
    out
}

/// Stored rows reached their promised end state, done ones by a successful call.
fn check_end_states(
    record: &Record,
    rows: &[Row],
    expect: &Expect,
    calls: &HashMap<String, Vec<Call>>,
    v: &mut Verdict,
) {
    let promised = promised(record, rows, expect);
    for r in rows {
        let want = promised.get(&r.id).copied().unwrap_or("done");
        if r.status != want {
            v.lost += 1;
            v.note(format!(
                "{} ({}): {} where {want} was due",
                r.id, r.dedup_key, r.status
            ));
            continue;
        }
        let succeeded = calls
            .get(&r.id)
            .is_some_and(|c| c.iter().any(|c| c.outcome == Outcome::Succeeded));
        if want == "done" && !succeeded {
            v.lost += 1;
            v.note(format!("{}: done without a successful handler call", r.id));
        }
        if want == "dead" && r.attempts != expect.dead_attempts {
            v.lost += 1;
            v.note(format!(
                "{}: dead after {} attempts, not {}",
                r.id, r.attempts, expect.dead_attempts
            ));
        }
    }
}

/// One event's runs: never two at once (a run lasts until its answer
/// began: the caller cannot act on it sooner), never again after a
/// success unless that success's commit could have been lost or come
/// too late: a disruption that ended after the successful call started
/// (a kill while it ran also loses it, even when the receiver's answer
/// went into a dead socket's buffer; a kill lasts until the process is
/// reaped), or the rerun started once the successful run's lease
/// (`expect.lease`, from up to [`CLAIM_LEAD`] before the call) can have
/// expired.
fn check_runs(
    id: &str,
    calls: &[Call],
    timed_out: &[i64],
    disruptions: &[(Duration, Duration)],
    expect: &Expect,
    v: &mut Verdict,
) {
    let mut running_until = Duration::ZERO;
    // Start of the first successful call.
    let mut succeeded_at: Option<Duration> = None;
    for c in calls {
        if c.start < running_until {
            v.duplicates += 1;
            v.note(format!(
                "{id}: attempt {} overlapped an earlier run",
                c.attempt
            ));
        } else if let Some(done) = succeeded_at {
            let lease_expired = expect
                .lease
                .is_some_and(|lease| c.start + CLAIM_LEAD >= done + lease);
            let excused = lease_expired
                || disruptions
                    .iter()
                    .any(|(from, to)| *to >= done && *from <= c.start);
            if excused {
                v.excused += 1;
            } else {
                v.duplicates += 1;
                v.note(format!(
                    "{id}: attempt {} ran after a completed run; calls {}; disruptions {}",
                    c.attempt,
                    describe(calls),
                    spans(disruptions)
                ));
            }
        }
        running_until = running_until.max(c.answered);
        let cut = timed_out.contains(&i64::from(c.attempt));
        if c.outcome == Outcome::Succeeded && !cut && succeeded_at.is_none() {
            succeeded_at = Some(c.start);
        }
    }
}

/// A few calls in words: `a1 10.001-10.004s ok`.
fn describe(calls: &[Call]) -> String {
    let words: Vec<String> = calls
        .iter()
        .take(6)
        .map(|c| {
            format!(
                "a{} {:.3}-{:.3}s {:?}",
                c.attempt,
                c.start.as_secs_f64(),
                c.end.as_secs_f64(),
                c.outcome
            )
        })
        .collect();
    format!("[{}]", words.join(", "))
}

/// Disruption spans in words: `[10.001-10.020s, ...]`.
fn spans(disruptions: &[(Duration, Duration)]) -> String {
    let words: Vec<String> = disruptions
        .iter()
        .map(|(f, t)| format!("{:.3}-{:.3}s", f.as_secs_f64(), t.as_secs_f64()))
        .collect();
    format!("[{}]", words.join(", "))
}

/// Per sequential key, the acked events in arrival (send) order.
fn arrival_by_key(
    record: &Record,
    rows: &[Row],
    expect: &Expect,
) -> HashMap<String, BTreeMap<u64, String>> {
    let topic: HashMap<&str, &str> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.topic.as_str()))
        .collect();
    let mut out: HashMap<String, BTreeMap<u64, String>> = HashMap::new();
    for a in &record.acks {
        let Some(key) = &a.key else { continue };
        let Some(t) = topic.get(a.event_id.as_str()) else {
            continue;
        };
        if expect.sequential.contains(*t) {
            out.entry(format!("{t}/{key}"))
                .or_default()
                .entry(a.seq)
                .or_insert_with(|| a.event_id.clone());
        }
    }
    out
}

/// For each sequential key, no call of event N+1 starts before event N's
/// first successful call began to answer (the receiver may record the
/// end of its write after the caller already acted on it).
fn check_order(
    record: &Record,
    rows: &[Row],
    expect: &Expect,
    calls: &HashMap<String, Vec<Call>>,
    v: &mut Verdict,
) {
    let none = Vec::new();
    for (key, events) in arrival_by_key(record, rows, expect) {
        let ids: Vec<&String> = events.values().collect();
        for pair in ids.windows(2) {
            let done = calls
                .get(pair[0])
                .unwrap_or(&none)
                .iter()
                .filter(|c| c.outcome == Outcome::Succeeded)
                .map(|c| c.answered)
                .min();
            for c in calls.get(pair[1]).unwrap_or(&none) {
                if done.is_none_or(|d| c.start < d) {
                    v.order += 1;
                    v.note(format!(
                        "{key}: {} started before {} was done; calls {} then {}",
                        pair[1],
                        pair[0],
                        describe(calls.get(pair[0]).unwrap_or(&none)),
                        describe(calls.get(pair[1]).unwrap_or(&none)),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::record::Ack;

    impl Verdict {
        fn passed(&self) -> bool {
            self.lost == 0 && self.duplicates == 0 && self.order == 0
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ack(n: u64, key: &str) -> Ack {
        Ack {
            dedup_key: format!("d{n}"),
            event_id: format!("e{n}"),
            duplicate: false,
            key: Some(key.into()),
            seq: n,
            sent_at: ms(n),
            at: ms(n),
        }
    }

    fn row(n: u64, key: &str, status: &str) -> Row {
        Row {
            id: format!("e{n}"),
            dedup_key: format!("d{n}"),
            topic: "seq".into(),
            key: Some(key.into()),
            status: status.into(),
            attempts: 1,
            timed_out: Vec::new(),
        }
    }

    fn call(n: u64, attempt: u32, start: u64, end: u64, outcome: Outcome) -> Call {
        Call {
            event_id: format!("e{n}"),
            attempt,
            start: ms(start),
            answered: ms(end),
            end: ms(end),
            outcome,
        }
    }

    /// Two events of key `k`, each acked, stored, done and run once in order.
    fn clean() -> (Record, Vec<Row>, Expect) {
        let record = Record {
            sent: 2,
            acks: vec![ack(1, "k"), ack(2, "k")],
            calls: vec![
                call(1, 1, 10, 20, Outcome::Succeeded),
                call(2, 1, 25, 30, Outcome::Succeeded),
            ],
            ..Record::default()
        };
        let rows = vec![row(1, "k", "done"), row(2, "k", "done")];
        let expect = Expect {
            sequential: ["seq".to_string()].into(),
            ..Expect::default()
        };
        (record, rows, expect)
    }

    /// The clean record passes: the checker is not simply failing everything.
    #[test]
    fn a_clean_record_passes() {
        let (record, rows, expect) = clean();
        let v = check(&record, &rows, &expect);
        assert!(v.passed(), "{v:?}");
        assert_eq!(v.acked, 2);
    }

    /// An acked event missing from the store is lost.
    #[test]
    fn an_acked_event_missing_from_the_store_is_lost() {
        let (record, mut rows, expect) = clean();
        rows.pop();
        let v = check(&record, &rows, &expect);
        assert_eq!(v.lost, 1, "{v:?}");
        assert!(!v.passed());
    }

    /// A stored event never processed (still pending, or done with no
    /// successful call) is lost.
    #[test]
    fn a_stored_event_never_processed_is_lost() {
        let (mut record, mut rows, expect) = clean();
        rows[1].status = "pending".into();
        record.calls.pop();
        assert_eq!(check(&record, &rows, &expect).lost, 1);
        rows[1].status = "done".into();
        assert_eq!(check(&record, &rows, &expect).lost, 1);
    }

    /// Two overlapping runs of one event are duplicate processing.
    #[test]
    fn an_overlap_is_a_duplicate() {
        let (mut record, rows, expect) = clean();
        record.calls.push(call(2, 2, 27, 29, Outcome::Failed));
        let v = check(&record, &rows, &expect);
        assert_eq!(v.duplicates, 1, "{v:?}");
        assert!(!v.passed());
    }

    /// A completed event run again once its successful run's lease had
    /// expired is counted, not failed; run again before the lease expired,
    /// or while it still ran, it is a duplicate.
    #[test]
    fn a_rerun_after_the_lease_expired_is_excused_but_not_before_nor_an_overlap() {
        let (mut record, rows, mut expect) = clean();
        // Event 2's successful call began at 25 ms; its lease is 2 s, and
        // began up to CLAIM_LEAD (1 s) before the call: expired at 1025 ms.
        expect.lease = Some(ms(2000));
        record
            .calls
            .push(call(2, 2, 1025, 1030, Outcome::Succeeded));
        let v = check(&record, &rows, &expect);
        assert_eq!((v.duplicates, v.excused), (0, 1), "{v:?}");
        record.calls[2] = call(2, 2, 1024, 1030, Outcome::Succeeded);
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
        record.calls[2] = call(2, 2, 1025, 1030, Outcome::Succeeded);
        record.calls.push(call(1, 2, 15, 18, Outcome::Succeeded));
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
        // Without a lease, only a disruption excuses a rerun.
        record.calls.pop();
        expect.lease = None;
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
    }

    /// A completed event run again with no disruption in between is a
    /// duplicate; after a disruption that may have lost its completion it
    /// is the at-least-once allowance.
    #[test]
    fn a_rerun_after_success_is_a_duplicate_unless_disrupted() {
        let (mut record, rows, expect) = clean();
        record.calls.push(call(2, 2, 40, 45, Outcome::Succeeded));
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
        record.disruptions.push((ms(35), ms(35)));
        assert!(check(&record, &rows, &expect).passed());
        // A kill while the successful call ran (its answer written into a
        // dead connection) excuses the rerun too; one before it does not.
        record.disruptions = vec![(ms(27), ms(27))];
        assert!(check(&record, &rows, &expect).passed());
        record.disruptions = vec![(ms(22), ms(22))];
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
        // A span (a full disk) that covers the success excuses it; one
        // that ended before the success began does not.
        record.disruptions = vec![(ms(20), ms(26))];
        assert!(check(&record, &rows, &expect).passed());
        record.disruptions = vec![(ms(5), ms(24))];
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
    }

    /// A fenced (rejected) late completion changes nothing and is only counted.
    #[test]
    fn a_fenced_completion_is_counted_not_a_duplicate() {
        let (mut record, rows, expect) = clean();
        record.calls.push(call(2, 1, 24, 60, Outcome::Fenced));
        let v = check(&record, &rows, &expect);
        assert!(v.passed(), "{v:?}");
        assert_eq!(v.fenced, 1);
    }

    /// Event 2 of a key started before event 1 finished: an order violation.
    #[test]
    fn an_order_violation_is_caught() {
        let (mut record, rows, expect) = clean();
        record.calls[1] = call(2, 1, 15, 30, Outcome::Succeeded);
        let v = check(&record, &rows, &expect);
        assert_eq!(v.order, 1, "{v:?}");
        assert!(!v.passed());
    }

    /// The key's next event may start once its predecessor's answer began
    /// to be written, even when the receiver recorded the write's end
    /// later (its task descheduled in between); not before.
    #[test]
    fn order_is_judged_from_when_the_answer_began() {
        let (mut record, rows, expect) = clean();
        record.calls[0].answered = ms(18);
        record.calls[0].end = ms(27);
        record.calls[1] = call(2, 1, 25, 30, Outcome::Succeeded);
        assert!(check(&record, &rows, &expect).passed());
        record.calls[1] = call(2, 1, 17, 30, Outcome::Succeeded);
        assert_eq!(check(&record, &rows, &expect).order, 1);
    }

    /// A kill lasts until the process is reaped: a success it answered
    /// after the signal but before its death may be lost and rerun; a
    /// success that began after the reap may not.
    #[test]
    fn a_kill_spans_until_the_process_is_reaped() {
        let (mut record, rows, expect) = clean();
        record.calls[1] = call(2, 1, 25, 28, Outcome::Succeeded);
        record
            .calls
            .push(call(2, 2, 3000, 3003, Outcome::Succeeded));
        record.disruptions = vec![(ms(22), ms(30))];
        assert!(check(&record, &rows, &expect).passed());
        record.disruptions = vec![(ms(22), ms(24))];
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
    }

    /// A success the handler side saw in an attempt that mailroom's
    /// timeout had cut (recorded `retry`, "timed out") is no completed run:
    /// the next attempt is right. Any other attempt's success still is.
    #[test]
    fn a_success_cut_by_the_timeout_may_run_again() {
        let (mut record, mut rows, expect) = clean();
        record.calls.push(call(2, 2, 40, 45, Outcome::Succeeded));
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
        rows[1].timed_out = vec![1];
        assert!(check(&record, &rows, &expect).passed());
        rows[1].timed_out = vec![2];
        assert_eq!(check(&record, &rows, &expect).duplicates, 1);
    }

    /// Two different ids answered for one dedup key: a duplicate event.
    #[test]
    fn two_ids_for_one_dedup_key_is_a_duplicate() {
        let (mut record, rows, expect) = clean();
        let mut again = ack(1, "k");
        again.event_id = "e9".into();
        record.acks.push(again);
        let v = check(&record, &rows, &expect);
        assert!(v.duplicates >= 1 && v.lost >= 1, "{v:?}");
    }

    /// A poison head must be dead after max attempts and block its key;
    /// an event that ran behind it anyway is an order violation.
    #[test]
    fn a_dead_head_blocks_its_key() {
        let (mut record, mut rows, mut expect) = clean();
        expect.dead.insert("d1".into());
        expect.dead_attempts = 3;
        record.calls = vec![call(1, 1, 10, 12, Outcome::Failed)];
        rows[0].status = "dead".into();
        rows[0].attempts = 3;
        rows[1].status = "pending".into();
        assert!(check(&record, &rows, &expect).passed());
        rows[0].attempts = 2;
        assert_eq!(check(&record, &rows, &expect).lost, 1);
        rows[0].attempts = 3;
        record.calls.push(call(2, 1, 20, 21, Outcome::Failed));
        assert_eq!(check(&record, &rows, &expect).order, 1);
    }
}
