//! The registry's clock as this bench knows it, which fences commands
//! (docs/architecture.md "Fencing").
//!
//! A command's `not_after` is an instant on the registry's clock. The bench
//! samples that clock with `GET {base_url}/api/v1/time`, NTP-style: the
//! answer is taken to be the registry's time at the midpoint of the round
//! trip, to within half the round trip. Each sample is then carried
//! forward on this process's monotonic clock, so the bench's own wall clock
//! (seconds off, or stepped) never enters the judgement, and a bench that
//! did not run for a while (SIGSTOP, a frozen VM) still knows how much time
//! passed. The uncertainty of an estimate is the sample's half round trip
//! plus a drift allowance of [`DRIFT_PPM`] for the time since.
//!
//! Until the first sample answers, the bench has only its own wall clock,
//! raised to the `sent_at` of the newest command envelope when that is
//! later (a command cannot arrive before it was sent).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::Utc;
use shared_protocol::api::RegistryTime;
use shared_protocol::Timestamp;
use tokio::sync::watch;

/// Allowance for the two monotonic clocks drifting apart between samples,
/// parts per million (100 ppm: 0.1 ms per second since the sample).
pub const DRIFT_PPM: u64 = 100;
/// How often the registry's clock is sampled while samples answer.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(30);
/// How soon a failed sample is tried again.
pub const RETRY_PERIOD: Duration = Duration::from_secs(5);
/// Longest wait for one sample's answer.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Samples kept; the estimate uses the one that is most certain now.
const KEEP: usize = 8;
/// An offset from the bench's wall clock above this is logged as a warning.
const OFFSET_WARN: chrono::Duration = chrono::Duration::seconds(1);

/// What the bench believes the registry's clock reads now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The registry's time, best estimate.
    pub now: Timestamp,
    /// The true registry time is within `now ± uncertainty`.
    pub uncertainty: Duration,
    /// False until a sample answered: `now` is then the bench's own wall
    /// clock (or the newest envelope's `sent_at`, if later) and
    /// `uncertainty` is zero.
    pub synced: bool,
}

impl Estimate {
    /// The latest the registry's clock may read now.
    pub fn latest(&self) -> Timestamp {
        self.now + chrono::Duration::from_std(self.uncertainty).unwrap_or(chrono::Duration::MAX)
    }
}

/// Why a sample failed.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("GET {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("GET {url} answered {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("GET {url} timed out after {} ms", SAMPLE_TIMEOUT.as_millis())]
    Timeout { url: String },
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Monotonic midpoint of the round trip.
    at: Instant,
    /// The registry's answer.
    registry: Timestamp,
    half_rtt: Duration,
}

impl Sample {
    fn uncertainty_at(&self, now: Instant) -> Duration {
        let age = now.saturating_duration_since(self.at);
        self.half_rtt + drift(age)
    }
}

/// The drift allowance ([`DRIFT_PPM`]) for `age` of carrying an instant
/// on this process's monotonic clock.
pub fn drift(age: Duration) -> Duration {
    Duration::from_micros(
        u64::try_from(age.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_mul(DRIFT_PPM)
            / 1_000_000,
    )
}

#[derive(Default)]
struct State {
    samples: VecDeque<Sample>,
    /// The newest `sent_at` of a received envelope, and when it arrived.
    sent_bound: Option<(Instant, Timestamp)>,
    last_attempt: Option<Instant>,
}

/// The registry's clock, sampled over HTTP. Share the `Arc`.
pub struct RegistryClock {
    url: String,
    http: reqwest::Client,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl RegistryClock {
    /// A clock for the registry at `base_url` (e.g.
    /// `https://registry.lab.example`); nothing is sampled until
    /// [`RegistryClock::sample`] or [`RegistryClock::run`]. `trust`: the
    /// only CA certificates an `https://` registry may be signed by
    /// ([`crate::tls::http_trust`]); `None`: the system's.
    ///
    /// Errors: the HTTP client cannot be built (TLS backend).
    pub fn new(
        base_url: &str,
        trust: Option<&[reqwest::Certificate]>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let builder = reqwest::Client::builder()
            .connect_timeout(SAMPLE_TIMEOUT)
            .timeout(SAMPLE_TIMEOUT)
            .pool_max_idle_per_host(1);
        let http = crate::tls::trusting(builder, trust).build()?;
        Ok(Arc::new(Self {
            url: format!("{}/api/v1/time", base_url.trim_end_matches('/')),
            http,
            state: Mutex::new(State::default()),
        }))
    }

    /// The registry's time now, as well as the bench knows it.
    pub fn estimate(&self) -> Estimate {
        let now = Instant::now();
        let st = lock(&self.state);
        let best = st
            .samples
            .iter()
            .min_by_key(|s| s.uncertainty_at(now))
            .copied();
        match best {
            Some(s) => Estimate {
                now: s.registry + to_chrono(now.saturating_duration_since(s.at)),
                uncertainty: s.uncertainty_at(now),
                synced: true,
            },
            None => {
                let wall = Utc::now();
                let bound = st
                    .sent_bound
                    .map(|(at, sent)| sent + to_chrono(now.saturating_duration_since(at)));
                Estimate {
                    now: bound.filter(|b| *b > wall).unwrap_or(wall),
                    uncertainty: Duration::ZERO,
                    synced: false,
                }
            }
        }
    }

    /// The registry's time at `instant` (an earlier moment of this
    /// process's monotonic clock), best estimate.
    pub fn at(&self, instant: Instant) -> Timestamp {
        self.estimate().now - to_chrono(Instant::now().saturating_duration_since(instant))
    }

    /// How long ago the newest sample was taken; `None` before the first.
    pub fn age(&self) -> Option<Duration> {
        lock(&self.state).samples.back().map(|s| s.at.elapsed())
    }

    /// A command envelope stamped `sent_at` by the registry just arrived:
    /// the registry's clock reads at least that now (used only until the
    /// first sample).
    pub fn note_sent_at(&self, sent_at: Timestamp) {
        let mut st = lock(&self.state);
        let newer = st.sent_bound.is_none_or(|(at, old)| {
            sent_at > old + to_chrono(Instant::now().saturating_duration_since(at))
        });
        if newer {
            st.sent_bound = Some((Instant::now(), sent_at));
        }
    }

    /// Take one sample now; returns its half round trip.
    ///
    /// Errors: the registry did not answer 200 within [`SAMPLE_TIMEOUT`].
    pub async fn sample(&self) -> Result<Duration, ClockError> {
        lock(&self.state).last_attempt = Some(Instant::now());
        let sent = Instant::now();
        let answer = tokio::time::timeout(SAMPLE_TIMEOUT, async {
            let resp =
                self.http
                    .get(&self.url)
                    .send()
                    .await
                    .map_err(|source| ClockError::Http {
                        url: self.url.clone(),
                        source,
                    })?;
            if !resp.status().is_success() {
                return Err(ClockError::Status {
                    url: self.url.clone(),
                    status: resp.status(),
                });
            }
            resp.json::<RegistryTime>()
                .await
                .map_err(|source| ClockError::Http {
                    url: self.url.clone(),
                    source,
                })
        })
        .await
        .map_err(|_| ClockError::Timeout {
            url: self.url.clone(),
        })??;
        let received = Instant::now();
        let rtt = received.saturating_duration_since(sent);
        let sample = Sample {
            at: sent + rtt / 2,
            registry: answer.now,
            half_rtt: rtt / 2,
        };
        let mut st = lock(&self.state);
        let first = st.samples.is_empty();
        st.samples.push_back(sample);
        while st.samples.len() > KEEP {
            st.samples.pop_front();
        }
        drop(st);
        let offset = sample.registry - (Utc::now() - to_chrono(received - sample.at));
        if first {
            let level_warn = offset.abs() > OFFSET_WARN;
            let ms = offset.num_milliseconds();
            let how = if ms >= 0 { "behind" } else { "ahead of" };
            if level_warn {
                tracing::warn!(
                    offset_ms = ms,
                    half_rtt_us = sample.half_rtt.as_micros() as u64,
                    "this bench's clock is {} ms {how} the registry's; commands are fenced by the registry's clock",
                    ms.abs()
                );
            } else {
                tracing::info!(
                    offset_ms = ms,
                    half_rtt_us = sample.half_rtt.as_micros() as u64,
                    "registry clock sampled; commands are fenced by it"
                );
            }
        }
        Ok(sample.half_rtt)
    }

    /// Sample again unless an attempt was made within `min_gap`; for a
    /// judgement that a fresher sample could change. Failures are logged
    /// at debug (the periodic sampler reports them).
    pub async fn refresh(&self, min_gap: Duration) {
        let recent = lock(&self.state)
            .last_attempt
            .is_some_and(|t| t.elapsed() < min_gap);
        if recent {
            return;
        }
        if let Err(e) = self.sample().await {
            tracing::debug!(error = %e, "registry clock sample failed");
        }
    }

    /// Sample until `stop` turns true: three samples at start (the best
    /// round trip wins), then every [`RESYNC_PERIOD`]; after a failure
    /// every [`RETRY_PERIOD`] (logged at the first failure and on
    /// recovery).
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut failing = false;
        let mut burst = 3;
        loop {
            let wait = match self.sample().await {
                Ok(_) => {
                    if failing {
                        tracing::info!("registry clock answers again");
                        failing = false;
                    }
                    if burst > 1 {
                        burst -= 1;
                        Duration::from_millis(100)
                    } else {
                        RESYNC_PERIOD
                    }
                }
                Err(e) => {
                    if !failing {
                        let est = self.estimate();
                        tracing::warn!(
                            error = %e,
                            synced = est.synced,
                            uncertainty_ms = est.uncertainty.as_millis() as u64,
                            "cannot sample the registry's clock; commands are fenced by the last sample (or this bench's own clock)"
                        );
                        failing = true;
                    }
                    RETRY_PERIOD
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Arc<RegistryClock> {
        RegistryClock::new("http://127.0.0.1:9", None).unwrap()
    }

    #[test]
    fn an_unsynced_clock_is_the_wall_clock_raised_to_the_newest_sent_at() {
        let c = clock();
        let e = c.estimate();
        assert!(!e.synced);
        assert!((e.now - Utc::now()).num_milliseconds().abs() < 50);
        // A registry 5 s ahead of this bench stamped a command.
        c.note_sent_at(Utc::now() + chrono::Duration::seconds(5));
        let e = c.estimate();
        assert!((e.now - Utc::now()).num_milliseconds() > 4_900, "{e:?}");
        // An older stamp does not lower the bound.
        c.note_sent_at(Utc::now() - chrono::Duration::seconds(60));
        assert!((c.estimate().now - Utc::now()).num_milliseconds() > 4_900);
    }

    #[test]
    fn a_sample_is_carried_forward_on_the_monotonic_clock_with_growing_uncertainty() {
        let c = clock();
        let registry = Utc::now() - chrono::Duration::seconds(5);
        let at = Instant::now() - Duration::from_secs(10);
        lock(&c.state).samples.push_back(Sample {
            at,
            registry,
            half_rtt: Duration::from_micros(300),
        });
        let e = c.estimate();
        assert!(e.synced);
        // 10 s since the sample: registry time moved 10 s on.
        let moved = (e.now - registry).num_milliseconds();
        assert!((9_990..10_100).contains(&moved), "{moved}");
        // 300 µs + 100 ppm of 10 s = 1.3 ms.
        assert!(
            e.uncertainty >= Duration::from_micros(1_299)
                && e.uncertainty < Duration::from_micros(1_400),
            "{:?}",
            e.uncertainty
        );
        assert!(e.latest() > e.now);
    }

    #[test]
    fn the_most_certain_sample_wins() {
        let c = clock();
        let base = Utc::now();
        let now = Instant::now();
        {
            let mut st = lock(&c.state);
            // A slow round trip just now, said to be 1 s later than the truth.
            st.samples.push_back(Sample {
                at: now,
                registry: base + chrono::Duration::seconds(1),
                half_rtt: Duration::from_millis(400),
            });
            // A tight one a second ago.
            st.samples.push_back(Sample {
                at: now - Duration::from_secs(1),
                registry: base - chrono::Duration::seconds(1),
                half_rtt: Duration::from_micros(200),
            });
        }
        let e = c.estimate();
        assert!(e.uncertainty < Duration::from_millis(1), "{e:?}");
        assert!((e.now - base).num_milliseconds().abs() < 50, "{e:?}");
    }

    #[tokio::test]
    async fn a_sample_of_a_registry_that_is_not_there_fails_with_the_url() {
        let c = clock();
        let e = c.sample().await.unwrap_err();
        assert!(e.to_string().contains("/api/v1/time"), "{e}");
        assert!(!c.estimate().synced);
    }
}
