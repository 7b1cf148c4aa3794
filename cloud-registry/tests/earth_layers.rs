//! `GET /api/v1/visualization/geo/{layer}` over real HTTP on the shipped
//! data (docs/earth-command.md, "Layers"): the collections the Earth map
//! draws carry the same entity ids the Earth command returns, satellites
//! are positioned for `?at=`, and the answers revalidate with their ETag.

mod agents_support;

use std::collections::HashSet;

use agents_support::*;
use cloud_registry::agents::config::AgentsConfig;
use reqwest::StatusCode;
use serde_json::Value;
use shared_protocol::api::Role;

fn ids(fc: &Value) -> HashSet<String> {
    fc["features"]
        .as_array()
        .unwrap_or_else(|| panic!("not a FeatureCollection: {fc}"))
        .iter()
        .map(|f| f["properties"]["entity_id"].as_str().unwrap().to_string())
        .collect()
}

fn feature<'a>(fc: &'a Value, id: &str) -> &'a Value {
    fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["properties"]["entity_id"] == id)
        .unwrap_or_else(|| panic!("{id} not in the {} layer", fc["layer"]))
}

fn matched_ids(resp: &Value) -> Vec<String> {
    resp["matched_entities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entity_id"].as_str().unwrap().to_string())
        .collect()
}

async fn layer(h: &Harness, path: &str) -> Value {
    let (status, headers, body) = h.geo(Role::Viewer, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    assert_eq!(
        headers["content-type"], "application/geo+json",
        "{path} content type"
    );
    assert_eq!(body["type"], "FeatureCollection", "{path}");
    assert_eq!(
        body["count"].as_u64().unwrap() as usize,
        body["features"].as_array().unwrap().len(),
        "{path} count"
    );
    body
}

fn lon_lat(f: &Value) -> (f64, f64) {
    let c = &f["geometry"]["coordinates"];
    (c[0].as_f64().unwrap(), c[1].as_f64().unwrap())
}

#[tokio::test]
async fn satellites_layer_holds_every_satellite_the_beidou_command_highlights() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("高亮所有北斗卫星").await;
    let sats = layer(&h, "satellites").await;
    assert_eq!(sats["layer"], "satellites");
    // Every TLE of the shipped file propagates to a position.
    assert_eq!(sats["count"], 3159, "{}", sats["missing_data"]);
    let layer_ids = ids(&sats);
    let highlighted = highlighted(&resp);
    assert_eq!(highlighted.len(), 50);
    for id in highlighted.iter().chain(matched_ids(&resp).iter()) {
        assert!(layer_ids.contains(id), "{id} highlighted but not drawn");
    }
    let beidou = feature(&sats, "satellite:norad:36287");
    let p = &beidou["properties"];
    assert_eq!(p["norad_id"], 36287);
    assert_eq!(p["constellation"], "beidou");
    assert!(p["name"].as_str().unwrap().starts_with("BEIDOU"), "{p}");
    assert!(p["orbital_class"].is_string() && p["tle_epoch"].is_string());
    assert_eq!(beidou["geometry"]["type"], "Point");
    for f in sats["features"].as_array().unwrap() {
        let (lon, lat) = lon_lat(f);
        assert!(lon.abs() <= 180.0 && lat.abs() <= 90.0, "{f}");
    }
    // The shipped TLEs are from 2020: the layer says positions are stale.
    let notes = sats["missing_data"].to_string();
    assert!(notes.contains("SGP4 extrapolations"), "{notes}");
}

#[tokio::test]
async fn satellites_are_positioned_at_the_requested_time() {
    let h = Harness::start(AgentsConfig::default()).await;
    // Near the TLE epochs: the ISS is where low orbits are, at ~420 km.
    let a = layer(&h, "satellites?at=2020-10-26T12:00:00Z").await;
    assert_eq!(a["at"], "2020-10-26T12:00:00Z");
    let iss = feature(&a, "satellite:norad:25544");
    let alt = iss["properties"]["alt_km"].as_f64().unwrap();
    assert!((380.0..460.0).contains(&alt), "ISS at {alt} km");
    assert_eq!(iss["properties"]["position_time"], "2020-10-26T12:00:00Z");
    assert!(
        !a["missing_data"].to_string().contains("extrapolations"),
        "{}",
        a["missing_data"]
    );
    // A BeiDou GEO stays near 35,786 km.
    let geo_alt = feature(&a, "satellite:norad:36287")["properties"]["alt_km"]
        .as_f64()
        .unwrap();
    assert!((34_500.0..37_000.0).contains(&geo_alt), "{geo_alt}");
    // Ten minutes later the ISS has moved by thousands of km; an offset
    // given as `+08:00` names the same instant as its UTC form.
    let b = layer(&h, "satellites?at=2020-10-26T20:10:00%2B08:00").await;
    assert_eq!(b["at"], "2020-10-26T12:10:00Z");
    let (lon_a, lat_a) = lon_lat(iss);
    let (lon_b, lat_b) = lon_lat(feature(&b, "satellite:norad:25544"));
    assert!(
        (lon_a - lon_b).abs() + (lat_a - lat_b).abs() > 10.0,
        "ISS did not move: {lon_a},{lat_a} → {lon_b},{lat_b}"
    );
}

#[tokio::test]
async fn satellites_now_agree_with_the_command_focus_position() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("聚焦国际空间站").await;
    let sats = layer(&h, "satellites").await;
    let m = &resp["matched_entities"][0];
    assert_eq!(m["entity_id"], "satellite:norad:25544", "{resp}");
    let (lon, lat) = lon_lat(feature(&sats, "satellite:norad:25544"));
    // Same second or the next: the ISS moves under 0.1° a second.
    assert!(
        (lat - m["lat"].as_f64().unwrap()).abs() < 1.0,
        "{lat} vs {}",
        m["lat"]
    );
    let dlon = (lon - m["lon"].as_f64().unwrap()).abs();
    assert!(!(1.0..=359.0).contains(&dlon), "{lon} vs {}", m["lon"]);
}

#[tokio::test]
async fn compute_center_and_cable_layers_hold_the_command_ids() {
    let h = Harness::start(AgentsConfig::default()).await;
    let centers = layer(&h, "compute-centers").await;
    let center_ids = ids(&centers);
    let resp = h.command("中国大陆的算力中心").await;
    let hl = highlighted(&resp);
    assert!(hl.len() > 100, "{}", resp["summary"]);
    for id in hl.iter().chain(matched_ids(&resp).iter()) {
        assert!(center_ids.contains(id), "{id} not in compute-centers");
    }
    let p = &feature(&centers, &hl[0])["properties"];
    for key in [
        "name",
        "country",
        "site_type",
        "source",
        "location_precision",
        "needs_confirmation",
    ] {
        assert!(!p[key].is_null(), "{key} missing in {p}");
    }

    let cables = layer(&h, "cables").await;
    let points = layer(&h, "landing-points").await;
    let (cable_ids, point_ids) = (ids(&cables), ids(&points));
    // 692 cables have geometry; one is only in cable-all.json.
    assert_eq!(cable_ids.len(), 692, "{}", cables["missing_data"]);
    assert!(cables["missing_data"]
        .to_string()
        .contains("1 cables have no route geometry"));
    let resp = h.command("显示中国的海缆").await;
    let hl = highlighted(&resp);
    assert!(!hl.is_empty(), "{}", resp["summary"]);
    for id in hl.iter().chain(matched_ids(&resp).iter()) {
        assert!(
            cable_ids.contains(id) || point_ids.contains(id),
            "{id} in neither cables nor landing-points"
        );
    }
    let cable = feature(
        &cables,
        hl.iter().find(|i| i.starts_with("cable:")).unwrap(),
    );
    assert_eq!(cable["geometry"]["type"], "MultiLineString");
    assert!(
        cable["geometry"]["coordinates"][0]
            .as_array()
            .unwrap()
            .len()
            >= 2
    );
    // Landing points name their cables, and each cable its landing points.
    for lp in cable["properties"]["landing_point_ids"].as_array().unwrap() {
        let lp = feature(&points, lp.as_str().unwrap());
        assert_eq!(lp["geometry"]["type"], "Point");
        assert!(lp["properties"]["cable_ids"]
            .as_array()
            .unwrap()
            .contains(&cable["properties"]["entity_id"]));
    }
}

#[tokio::test]
async fn layers_without_located_data_are_empty_collections_that_say_why() {
    let h = Harness::start(AgentsConfig::default()).await;
    for (path, note) in [
        ("vessels", "no data source configured for vessels"),
        ("news", "no data source configured for news"),
        ("bgp-events", "35 BGP events have no location in the source"),
    ] {
        let fc = layer(&h, path).await;
        assert_eq!(fc["count"], 0, "{path}");
        assert!(
            fc["missing_data"].to_string().contains(note),
            "{path}: {}",
            fc["missing_data"]
        );
    }
}

#[tokio::test]
async fn bad_time_unknown_layer_and_roles_are_refused_clearly() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (status, _, body) = h.geo(Role::Viewer, "satellites?at=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_query");
    assert_eq!(body["error"]["details"]["param"], "at");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("RFC 3339") && msg.contains("`yesterday`"),
        "{msg}"
    );

    // A time centuries away is refused at once rather than propagated.
    let (status, _, body) = h
        .geo(Role::Viewer, "satellites?at=9999-12-31T23:59:59Z")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["details"]["param"], "at");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("days from now"), "{msg}");

    let (status, _, body) = h.geo(Role::Viewer, "ships").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"]["details"]["layers"]
        .as_array()
        .unwrap()
        .contains(&Value::from("vessels")));

    for role in [Role::Viewer, Role::Operator, Role::Admin, Role::SuperAdmin] {
        let (status, _, _) = h.geo(role, "compute-centers").await;
        assert_eq!(status, StatusCode::OK, "{role:?}");
    }
    let (status, _, body) = h.geo(Role::Provider, "satellites").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let resp = h
        .http
        .get(format!("{}/satellites", h.geo_base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn layers_revalidate_with_their_etag() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (_, headers, _) = h.geo(Role::Viewer, "cables").await;
    let etag = headers["etag"].to_str().unwrap().to_string();
    assert_eq!(headers["cache-control"], "private, no-cache");
    let resp = h
        .http
        .get(format!("{}/cables", h.geo_base))
        .bearer_auth(&h.tokens[&Role::Viewer])
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    assert!(resp.bytes().await.unwrap().is_empty());

    // Satellites: one ETag per second of `at`; "now" may be cached 1 s.
    let (_, a, _) = h
        .geo(Role::Viewer, "satellites?at=2026-01-01T00:00:00Z")
        .await;
    let (_, b, _) = h
        .geo(Role::Viewer, "satellites?at=2026-01-01T00:00:00.600Z")
        .await;
    let (_, c, _) = h
        .geo(Role::Viewer, "satellites?at=2026-01-01T00:00:01Z")
        .await;
    assert_eq!(a["etag"], b["etag"]);
    assert_ne!(a["etag"], c["etag"]);
    let (_, now, _) = h.geo(Role::Viewer, "satellites").await;
    assert_eq!(now["cache-control"], "private, max-age=1");
}
