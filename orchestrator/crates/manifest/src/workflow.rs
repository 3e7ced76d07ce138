//! Typed reads of a workflow manifest, for the workflow engine.
//!
//! Like [`super::AgentView`], a thin view over the validated JSON value rather than a struct
//! tree: the engine needs the state graph and a few limits; state bodies stay JSON because they
//! are rendered as templates anyway.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::Value;

/// One outgoing transition of a state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransitionView<'a> {
    /// The condition tag (`on_success`, `score_above`, ...).
    pub condition: &'a str,
    /// The target state.
    pub target: &'a str,
    /// The whole transition object (condition parameters, feedback template).
    pub raw: &'a Value,
}

/// `spec.default_schedule`, in either of its two forms.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The cron expression (5 fields, or 6 with seconds first), read in `timezone`.
    pub cron: String,
    /// Input of every scheduled run.
    pub input: Value,
    /// False: written down, but no runs start.
    pub enabled: bool,
    /// IANA time zone of the cron expression (`UTC` unless given).
    pub timezone: String,
    /// Upper bound of the delay between a tick and its run, seconds (0: none).
    pub jitter_seconds: u64,
}

/// One tick of a schedule and the instant its run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing {
    /// The cron instant: the key every replica claims, so one run starts per tick.
    pub tick: DateTime<Utc>,
    /// `tick` plus the tick's delay: when the run is due.
    pub fire_at: DateTime<Utc>,
}

/// A schedule ready to compute ticks: the parsed expression in its time zone, and the jitter.
#[derive(Debug, Clone)]
pub struct Plan {
    cron: croner::Cron,
    zone: Tz,
    jitter_seconds: u64,
}

/// How many ticks the scheduler walks at most in one look (a stalled node does not spin).
const MAX_TICKS: usize = 100_000;

impl Schedule {
    /// The parsed expression, or why it is not one.
    pub fn parse(&self) -> Result<croner::Cron, String> {
        parse_cron(&self.cron)
    }

    /// The parsed expression in its time zone, or why the schedule cannot be run.
    pub fn plan(&self) -> Result<Plan, String> {
        let zone: Tz = self.timezone.parse().map_err(|_| {
            format!(
                "`{}` is not an IANA time zone name (such as `UTC`, `Europe/Berlin` or \
                 `America/New_York`)",
                self.timezone
            )
        })?;
        Ok(Plan {
            cron: self.parse()?,
            zone,
            jitter_seconds: self.jitter_seconds,
        })
    }
}

impl Plan {
    /// The delay of `tick`'s run, 0 to `jitter_seconds` inclusive. Derived only from `seed`
    /// (the workflow's definition id) and the tick, by a hash fixed here (not the standard
    /// library's, which may change between builds), so every replica computes the same delay.
    pub fn delay(&self, seed: &str, tick: DateTime<Utc>) -> chrono::Duration {
        if self.jitter_seconds == 0 {
            return chrono::Duration::zero();
        }
        let mut hash = FNV_OFFSET;
        for byte in seed
            .as_bytes()
            .iter()
            .chain(&tick.timestamp().to_be_bytes())
        {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(FNV_PRIME);
        }
        let seconds = mix(hash) % (self.jitter_seconds + 1);
        chrono::Duration::seconds(i64::try_from(seconds).unwrap_or(0))
    }

    /// The ticks strictly after `after`, in order, as UTC instants.
    pub fn ticks_after(&self, after: DateTime<Utc>) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        self.cron
            .iter_after(after.with_timezone(&self.zone))
            .map(|t| t.with_timezone(&Utc))
            .take(MAX_TICKS)
    }

    /// The latest tick whose run fell due in `(since, now]`: after a stall only the latest runs.
    pub fn due(&self, seed: &str, since: DateTime<Utc>, now: DateTime<Utc>) -> Option<Firing> {
        let window = chrono::Duration::seconds(i64::try_from(self.jitter_seconds).unwrap_or(0));
        self.ticks_after(since - window)
            .take_while(|tick| *tick <= now)
            .map(|tick| Firing {
                tick,
                fire_at: tick + self.delay(seed, tick),
            })
            .filter(|f| f.fire_at > since && f.fire_at <= now)
            .last()
    }

    /// The first run due after `now` (a tick before `now` whose delay has not passed counts).
    pub fn next(&self, seed: &str, now: DateTime<Utc>) -> Option<Firing> {
        let window = chrono::Duration::seconds(i64::try_from(self.jitter_seconds).unwrap_or(0));
        let mut best: Option<Firing> = None;
        for tick in self.ticks_after(now - window) {
            if best.is_some_and(|b| tick > b.fire_at) {
                break;
            }
            let fire_at = tick + self.delay(seed, tick);
            if fire_at > now && best.is_none_or(|b| fire_at < b.fire_at) {
                best = Some(Firing { tick, fire_at });
            }
        }
        best
    }

    /// The shortest time between two consecutive ticks among the next `count` after `from`.
    pub fn shortest_gap(&self, from: DateTime<Utc>, count: usize) -> Option<chrono::Duration> {
        let ticks: Vec<DateTime<Utc>> = self.ticks_after(from).take(count).collect();
        ticks.windows(2).map(|w| w[1] - w[0]).min()
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// SplitMix64's finaliser: spreads FNV's weak low bits before the modulo.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Parses a cron expression the way schedules are read: seconds field optional.
pub fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    croner::Cron::new(expression)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("`{expression}` is not a cron expression: {e}"))
}

/// A read-only view of a validated workflow manifest.
#[derive(Debug, Clone, Copy)]
pub struct WorkflowView<'a>(pub &'a Value);

impl<'a> WorkflowView<'a> {
    /// `metadata.name`.
    pub fn name(&self) -> &'a str {
        self.0
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `spec.initial_state`.
    pub fn initial_state(&self) -> &'a str {
        self.0
            .pointer("/spec/initial_state")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The names of all states.
    pub fn state_names(&self) -> Vec<&'a str> {
        self.0
            .pointer("/spec/states")
            .and_then(Value::as_object)
            .map(|states| states.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// One state's object.
    pub fn state(&self, name: &str) -> Option<&'a Value> {
        self.0.pointer("/spec/states")?.get(name)
    }

    /// `spec.default_schedule`, if any.
    pub fn default_schedule(&self) -> Option<Schedule> {
        match self.0.pointer("/spec/default_schedule")? {
            Value::String(cron) => Some(Schedule {
                cron: cron.clone(),
                input: Value::Object(Default::default()),
                enabled: true,
                timezone: "UTC".to_owned(),
                jitter_seconds: 0,
            }),
            Value::Object(o) => Some(Schedule {
                cron: o.get("cron")?.as_str()?.to_owned(),
                input: o
                    .get("input")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Default::default())),
                enabled: o.get("enabled").and_then(Value::as_bool).unwrap_or(true),
                timezone: o
                    .get("timezone")
                    .and_then(Value::as_str)
                    .unwrap_or("UTC")
                    .to_owned(),
                jitter_seconds: o.get("jitter_seconds").and_then(Value::as_u64).unwrap_or(0),
            }),
            _ => None,
        }
    }

    /// What the scheduler will do with `spec.default_schedule`, for status output: the schedule
    /// as read (time zone and jitter with their defaults) and its next run after `now` (`null`
    /// when disabled or never), with `seed` the workflow's definition id as the scheduler uses.
    pub fn schedule_status(&self, seed: &str, now: DateTime<Utc>) -> Option<Value> {
        let schedule = self.default_schedule()?;
        let next = schedule
            .plan()
            .ok()
            .filter(|_| schedule.enabled)
            .and_then(|plan| plan.next(seed, now));
        Some(serde_json::json!({
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "jitter_seconds": schedule.jitter_seconds,
            "enabled": schedule.enabled,
            "next_tick": next.map(|n| n.tick),
            "next_run_at": next.map(|n| n.fire_at),
        }))
    }

    /// One state's `update_blackboard`: key -> template, in key order.
    pub fn blackboard_updates(&self, name: &str) -> Vec<(&'a str, &'a str)> {
        self.state(name)
            .and_then(|s| s.get("update_blackboard"))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One state's `kind` (`Agent`, `System`, ...).
    pub fn state_kind(&self, name: &str) -> Option<&'a str> {
        self.state(name)?.get("kind")?.as_str()
    }

    /// One state's transitions, in evaluation order; empty for a terminal state.
    pub fn transitions(&self, name: &str) -> Vec<TransitionView<'a>> {
        self.state(name)
            .and_then(|s| s.get("transitions"))
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|raw| {
                        Some(TransitionView {
                            condition: raw.get("condition")?.as_str()?,
                            target: raw.get("target")?.as_str()?,
                            raw,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `spec.max_total_transitions` (default 50).
    pub fn max_total_transitions(&self) -> u64 {
        self.0
            .pointer("/spec/max_total_transitions")
            .and_then(Value::as_u64)
            .unwrap_or(50)
    }

    /// `metadata.input_schema`.
    pub fn input_schema(&self) -> Option<&'a Value> {
        self.0.pointer("/metadata/input_schema")
    }

    /// `metadata.output_schema`: the contract of the final output, checked when a run ends.
    pub fn output_schema(&self) -> Option<&'a Value> {
        self.0.pointer("/metadata/output_schema")
    }

    /// One state's `max_state_visits` (default 5).
    pub fn max_state_visits(&self, name: &str) -> u64 {
        self.state(name)
            .and_then(|s| s.get("max_state_visits"))
            .and_then(Value::as_u64)
            .unwrap_or(5)
    }

    /// `(state, workflow_id)` of every Subworkflow state in `blocking` mode: the child
    /// workflows a run of this one waits for (deploy-time validation follows these to refuse
    /// recursion that never ends).
    pub fn blocking_subworkflows(&self) -> Vec<(&'a str, &'a str)> {
        self.0
            .pointer("/spec/states")
            .and_then(Value::as_object)
            .map(|states| {
                states
                    .iter()
                    .filter(|(_, s)| {
                        s.get("kind").and_then(Value::as_str) == Some("Subworkflow")
                            && s.get("mode").and_then(Value::as_str) == Some("blocking")
                    })
                    .filter_map(|(name, s)| Some((name.as_str(), s.get("workflow_id")?.as_str()?)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(cron: &str, timezone: &str, jitter_seconds: u64) -> Plan {
        Schedule {
            cron: cron.to_owned(),
            input: json!({}),
            enabled: true,
            timezone: timezone.to_owned(),
            jitter_seconds,
        }
        .plan()
        .expect("a valid schedule")
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("an RFC 3339 instant")
    }

    #[test]
    fn ticks_are_read_in_the_time_zone_across_daylight_saving() {
        let berlin = plan("0 16 * * 1-5", "Europe/Berlin", 0);
        // Winter: 16:00 CET is 15:00 UTC; summer: 16:00 CEST is 14:00 UTC.
        let winter: Vec<_> = berlin
            .ticks_after(at("2027-01-08T00:00:00Z"))
            .take(2)
            .collect();
        assert_eq!(
            winter,
            [at("2027-01-08T15:00:00Z"), at("2027-01-11T15:00:00Z")],
            "Friday, then Monday"
        );
        let summer = berlin.ticks_after(at("2027-07-01T00:00:00Z")).next();
        assert_eq!(summer, Some(at("2027-07-01T14:00:00Z")));
        let utc = plan("0 16 * * 1-5", "UTC", 0);
        assert_eq!(
            utc.ticks_after(at("2027-07-01T00:00:00Z")).next(),
            Some(at("2027-07-01T16:00:00Z"))
        );
        assert!(Schedule {
            timezone: "Nowhere/Else".into(),
            ..Schedule {
                cron: "* * * * *".into(),
                input: json!({}),
                enabled: true,
                timezone: String::new(),
                jitter_seconds: 0,
            }
        }
        .plan()
        .is_err());
    }

    #[test]
    fn the_jitter_is_fixed_per_workflow_and_tick_and_bounded() {
        let p = plan("*/30 * * * *", "UTC", 300);
        let tick = at("2027-03-01T10:30:00Z");
        let delay = p.delay("wf-1", tick);
        assert_eq!(
            delay,
            p.delay("wf-1", tick),
            "every replica computes the same"
        );
        let delays: Vec<i64> = (0..200)
            .map(|i| {
                p.delay("wf-1", tick + chrono::Duration::minutes(30 * i))
                    .num_seconds()
            })
            .collect();
        assert!(delays.iter().all(|d| (0..=300).contains(d)));
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "spread over the window: {distinct:?}");
        assert_ne!(
            (0..20)
                .map(|i| p.delay("wf-1", tick + chrono::Duration::minutes(30 * i)))
                .collect::<Vec<_>>(),
            (0..20)
                .map(|i| p.delay("wf-2", tick + chrono::Duration::minutes(30 * i)))
                .collect::<Vec<_>>(),
            "another workflow, other delays"
        );
        assert_eq!(
            plan("*/30 * * * *", "UTC", 0)
                .delay("wf-1", tick)
                .num_seconds(),
            0
        );
    }

    #[test]
    fn a_tick_is_due_once_its_delay_has_passed() {
        let p = plan("*/30 * * * *", "UTC", 300);
        let tick = at("2027-03-01T10:30:00Z");
        let fire_at = tick + p.delay("wf", tick);
        let next = p
            .next("wf", tick - chrono::Duration::seconds(1))
            .expect("a next run");
        assert_eq!(next, Firing { tick, fire_at });
        // Not yet due just before its time, due in the window that holds it, and only once.
        let before = fire_at - chrono::Duration::seconds(1);
        assert_eq!(
            p.due("wf", tick - chrono::Duration::minutes(1), before),
            None
        );
        assert_eq!(p.due("wf", before, fire_at), Some(Firing { tick, fire_at }));
        assert_eq!(
            p.due("wf", fire_at, fire_at + chrono::Duration::seconds(60)),
            None
        );
        // After the run of a tick, the next run is the following tick's.
        let following = p.next("wf", fire_at).expect("a next run");
        assert_eq!(following.tick, tick + chrono::Duration::minutes(30));
    }

    #[test]
    fn reads_the_state_graph() {
        let value = json!({"spec": {"initial_state": "a", "states": {
            "a": {"kind": "System", "command": "true",
                  "transitions": [{"condition": "on_success", "target": "b"}]},
            "b": {"kind": "System", "command": "true", "transitions": []}}}});
        let wf = WorkflowView(&value);
        assert_eq!(wf.initial_state(), "a");
        assert_eq!(wf.state_names(), ["a", "b"]);
        assert_eq!(wf.state_kind("a"), Some("System"));
        let t = wf.transitions("a");
        assert_eq!((t[0].condition, t[0].target), ("on_success", "b"));
        assert!(wf.transitions("b").is_empty());
        assert_eq!(wf.max_total_transitions(), 50);
        assert_eq!(wf.max_state_visits("a"), 5);
        assert!(wf.blocking_subworkflows().is_empty());
    }
}
