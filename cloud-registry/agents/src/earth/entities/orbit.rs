//! SGP4 propagation to a geodetic position.
//!
//! The `sgp4` crate gives the position in the TEME frame (km). TEME is
//! rotated about the z axis by Greenwich mean sidereal time to get the
//! Earth-fixed frame (polar motion is ignored: metres, not kilometres), and
//! Earth-fixed coordinates are turned into WGS84 latitude, longitude and
//! height with Bowring's iteration.

use chrono::NaiveDateTime;

/// WGS84 equatorial radius, km.
const WGS84_A_KM: f64 = 6378.137;
/// WGS84 flattening.
const WGS84_F: f64 = 1.0 / 298.257_223_563;

/// A satellite position at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Geodetic {
    /// Degrees, -90..=90.
    pub lat_deg: f64,
    /// Degrees, -180..=180.
    pub lon_deg: f64,
    /// Height above the WGS84 ellipsoid, km.
    pub alt_km: f64,
}

/// Greenwich mean sidereal time at `at`, radians (IAU 1982 expression as
/// implemented by `sgp4`).
fn gmst_rad(at: &NaiveDateTime) -> f64 {
    sgp4::iau_epoch_to_sidereal_time(sgp4::julian_years_since_j2000(at))
}

/// TEME position (km) at `at` → WGS84 geodetic.
pub(crate) fn teme_to_geodetic(teme_km: [f64; 3], at: &NaiveDateTime) -> Geodetic {
    let theta = gmst_rad(at);
    let (s, c) = theta.sin_cos();
    let [x, y, z] = teme_km;
    let xe = c * x + s * y;
    let ye = -s * x + c * y;
    ecef_to_geodetic([xe, ye, z])
}

/// Earth-fixed (km) → WGS84 geodetic.
pub(crate) fn ecef_to_geodetic([x, y, z]: [f64; 3]) -> Geodetic {
    let e2 = WGS84_F * (2.0 - WGS84_F);
    let p = x.hypot(y);
    let lon = y.atan2(x);
    if p < 1e-9 {
        // On the polar axis.
        let b = WGS84_A_KM * (1.0 - WGS84_F);
        return Geodetic {
            lat_deg: if z >= 0.0 { 90.0 } else { -90.0 },
            lon_deg: 0.0,
            alt_km: z.abs() - b,
        };
    }
    let mut lat = z.atan2(p * (1.0 - e2));
    let mut alt = 0.0;
    for _ in 0..6 {
        let sin_lat = lat.sin();
        let n = WGS84_A_KM / (1.0 - e2 * sin_lat * sin_lat).sqrt();
        alt = p / lat.cos() - n;
        lat = z.atan2(p * (1.0 - e2 * n / (n + alt)));
    }
    Geodetic {
        lat_deg: lat.to_degrees(),
        lon_deg: lon.to_degrees(),
        alt_km: alt,
    }
}

/// A parsed TLE ready to propagate.
#[derive(Clone)]
pub(crate) struct Propagator {
    constants: sgp4::Constants,
    /// TLE epoch (UTC).
    pub epoch: NaiveDateTime,
    /// Resonance integrator state advanced at load time, for deep-space
    /// resonant orbits (GEO, 12 h). Copying it saves stepping 720 min at a
    /// time from the epoch on every query.
    warm_state: Option<sgp4::ResonanceState>,
}

impl std::fmt::Debug for Propagator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Propagator")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Propagator {
    /// Builds the SGP4 constants; `None` when the elements are unusable.
    pub fn new(elements: &sgp4::Elements) -> Option<Propagator> {
        let constants = sgp4::Constants::from_elements(elements).ok()?;
        Some(Propagator {
            warm_state: constants.initial_state(),
            constants,
            epoch: elements.datetime,
        })
    }

    /// Advances the resonance integrator to `at`, the time most queries will
    /// ask for (load time). Without this a geosynchronous satellite with a
    /// six-year-old TLE costs thousands of integrator steps per query.
    pub fn warm_up(&mut self, at: &NaiveDateTime) {
        if let Some(state) = self.warm_state.as_mut() {
            let t = minutes_between(&self.epoch, at);
            // An error leaves a usable (partly advanced or initial) state.
            let _ =
                self.constants
                    .propagate_from_state(sgp4::MinutesSinceEpoch(t), Some(state), false);
        }
    }

    /// True when the orbit uses the resonance integrator (and so benefits
    /// from [`Propagator::warm_up`]).
    pub fn is_resonant(&self) -> bool {
        self.warm_state.is_some()
    }

    /// Position at `at`; `None` when SGP4 fails (decayed or diverged
    /// elements far from the epoch).
    pub fn position_at(&self, at: &NaiveDateTime) -> Option<Geodetic> {
        let t = minutes_between(&self.epoch, at);
        let mut state = match self.warm_state {
            // The integrator only runs away from zero: reuse the warm state
            // when `t` is on the same side and at least as far.
            Some(s) if s.t() == 0.0 || ((s.t() > 0.0) == (t > 0.0) && t.abs() >= s.t().abs()) => {
                Some(s)
            }
            Some(_) => self.constants.initial_state(),
            None => None,
        };
        let prediction = self
            .constants
            .propagate_from_state(sgp4::MinutesSinceEpoch(t), state.as_mut(), false)
            .ok()?;
        if prediction.position.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let g = teme_to_geodetic(prediction.position, at);
        (g.lat_deg.is_finite() && g.lon_deg.is_finite() && g.alt_km.is_finite()).then_some(g)
    }
}

/// Minutes from `from` to `to` (negative when `to` is earlier).
fn minutes_between(from: &NaiveDateTime, to: &NaiveDateTime) -> f64 {
    (*to - *from).num_milliseconds() as f64 / 60_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equator_point_on_the_ellipsoid_has_zero_height() {
        let g = ecef_to_geodetic([WGS84_A_KM, 0.0, 0.0]);
        assert!(g.lat_deg.abs() < 1e-9 && g.lon_deg.abs() < 1e-9 && g.alt_km.abs() < 1e-6);
    }

    #[test]
    fn pole_is_latitude_ninety() {
        let g = ecef_to_geodetic([0.0, 0.0, 7000.0]);
        assert_eq!(g.lat_deg, 90.0);
    }

    #[test]
    fn geodetic_latitude_matches_a_known_point() {
        // 45°N 0°E at 0 m: x = (N) cos φ, z = N (1 - e²) sin φ.
        let e2 = WGS84_F * (2.0 - WGS84_F);
        let phi = 45f64.to_radians();
        let n = WGS84_A_KM / (1.0 - e2 * phi.sin().powi(2)).sqrt();
        let g = ecef_to_geodetic([n * phi.cos(), 0.0, n * (1.0 - e2) * phi.sin()]);
        assert!((g.lat_deg - 45.0).abs() < 1e-9, "{}", g.lat_deg);
        assert!(g.alt_km.abs() < 1e-6);
    }
}
