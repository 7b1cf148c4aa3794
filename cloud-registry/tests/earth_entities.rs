//! Earth entity query (seed 000 "Earth Entity Query") over the shipped real
//! data in `cloud-registry/data/earth`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::OnceLock;

use chrono::{DateTime, Duration, Utc};
use cloud_registry::agents::earth::entities::{
    Constellation, EarthDataConfig, EntityCatalog, EntityError, EntityFilters, EntityKind,
    EntityQuery, GeoJsonSource, SHIPPED_DATA_DIR,
};
use serde_json::json;
use shared_protocol::earth::{EarthDomain, MatchedEntity};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(SHIPPED_DATA_DIR).join(rel)
}

fn catalog() -> &'static EntityCatalog {
    static CATALOG: OnceLock<EntityCatalog> = OnceLock::new();
    CATALOG.get_or_init(|| {
        EntityCatalog::load(&EarthDataConfig::shipped(SHIPPED_DATA_DIR))
            .expect("shipped data loads")
    })
}

fn query(domain: EarthDomain, filters: serde_json::Value) -> EntityQuery {
    EntityQuery::from_tool_arguments(json!({"domain": domain, "filters": filters, "limit": 5000}))
        .expect("valid query")
}

fn names(entities: &[MatchedEntity]) -> Vec<&str> {
    entities.iter().map(|e| e.name.as_str()).collect()
}

/// TLE name lines (every third line) of the shipped CelesTrak file.
fn tle_names() -> Vec<String> {
    let text = std::fs::read_to_string(data("satellites/celestrak_active_2020-10-26.txt")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with("1 ") && !l.starts_with("2 ") && !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Epoch of the ISS element set in the shipped file.
fn iss_epoch() -> DateTime<Utc> {
    let iss = catalog()
        .get("satellite:norad:25544")
        .expect("ISS is in the file");
    iss.properties["tle_epoch"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn beidou_constellation_returns_every_beidou_line_of_the_tle_file_and_nothing_else() {
    let expected = tle_names().iter().filter(|n| n.contains("BEIDOU")).count();
    assert_eq!(expected, 50, "SOURCES.md counts 50 BEIDOU entries");
    let r = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"constellation": "beidou"}),
    ));
    assert_eq!(r.total_matched, expected);
    assert_eq!(r.entities.len(), expected);
    assert!(!r.truncated);
    for e in &r.entities {
        assert!(
            e.name.contains("BEIDOU"),
            "{} is not a BeiDou satellite",
            e.name
        );
        assert_eq!(e.properties["constellation"], "beidou");
        assert_eq!(e.country.as_deref(), Some("China"));
    }
}

#[test]
fn chinese_constellation_name_selects_the_same_satellites_as_beidou() {
    let f = EntityFilters {
        constellation: Some("北斗".parse::<Constellation>().unwrap()),
        ..Default::default()
    };
    let zh = catalog().find(&EntityQuery::new(EarthDomain::Satellites).with_filters(f));
    let en = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"constellation": "beidou"}),
    ));
    assert_eq!(names(&zh.entities), names(&en.entities));
    let by_name = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"name_contains": "北斗"}),
    ));
    assert_eq!(names(&by_name.entities), names(&en.entities));
}

#[test]
fn navigation_and_broadband_constellations_have_the_counts_in_sources_md() {
    for (constellation, count, marker) in [
        ("gps", 34, "NAVSTAR"),
        ("galileo", 26, "GALILEO"),
        ("glonass", 28, "GLONASS"),
        ("starlink", 774, "STARLINK"),
        ("iridium", 75, "IRIDIUM"),
        ("oneweb", 74, "ONEWEB"),
    ] {
        let r = catalog().find(&query(
            EarthDomain::Satellites,
            json!({"constellation": constellation}),
        ));
        assert_eq!(r.total_matched, count, "{constellation}");
        assert!(
            r.entities.iter().all(|e| e.name.contains(marker)),
            "{constellation}: {:?}",
            names(&r.entities)
        );
    }
}

#[test]
fn more_matches_than_the_default_limit_are_truncated_with_a_note() {
    let q = EntityQuery::from_tool_arguments(
        json!({"domain": "satellites", "filters": {"constellation": "starlink"}}),
    )
    .unwrap();
    let r = catalog().find(&q);
    assert_eq!(r.entities.len(), 500);
    assert_eq!(r.total_matched, 774);
    assert!(r.truncated);
    assert!(r
        .missing_data
        .iter()
        .any(|n| n.contains("774") && n.contains("500")));
}

#[test]
fn every_satellite_has_a_unique_norad_id_entity_id() {
    let r = catalog().find(&query(EarthDomain::Satellites, json!({})).at(iss_epoch()));
    assert_eq!(r.total_matched, tle_names().len());
    let mut seen = HashSet::new();
    for e in &r.entities {
        let norad = e.properties["norad_id"].as_u64().unwrap();
        assert_eq!(e.entity_id, format!("satellite:norad:{norad}"));
        assert!(
            seen.insert(e.entity_id.clone()),
            "duplicate {}",
            e.entity_id
        );
        assert!(catalog().contains(&e.entity_id));
    }
    assert!(!catalog().contains("satellite:norad:99999999"));
}

#[test]
fn results_are_sorted_by_name_then_id() {
    let r = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"constellation": "gps"}),
    ));
    let keys: Vec<(String, String)> = r
        .entities
        .iter()
        .map(|e| (e.name.to_lowercase(), e.entity_id.clone()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

#[test]
fn iss_propagated_near_its_epoch_flies_at_about_400_km() {
    let at = iss_epoch() + Duration::minutes(45);
    let r = catalog().find(&query(EarthDomain::Satellites, json!({"norad_id": 25544})).at(at));
    assert_eq!(r.entities.len(), 1);
    let iss = &r.entities[0];
    let alt = iss.properties["alt_km"].as_f64().unwrap();
    assert!((380.0..=440.0).contains(&alt), "ISS altitude {alt} km");
    let lat = iss.lat.unwrap();
    assert!(
        lat.abs() <= 51.7,
        "ISS latitude {lat} beyond its inclination"
    );
    assert!(iss.lon.unwrap().abs() <= 180.0);
    assert!(r.missing_data.iter().all(|n| !n.contains("TLE epochs")));
}

#[test]
fn geostationary_goes_16_sits_over_its_75_west_slot() {
    // GOES-16 was GOES-East at 75.2° W in October 2020: this checks the
    // TEME → Earth-fixed rotation, not just the orbit radius.
    let r = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"name_contains": "goes 16"}),
    ));
    let goes = r.entities.iter().find(|e| e.name == "GOES 16").unwrap();
    let at = goes.properties["tle_epoch"]
        .as_str()
        .unwrap()
        .parse::<DateTime<Utc>>()
        .unwrap();
    let goes = catalog()
        .find(
            &query(EarthDomain::Satellites, json!({"name_contains": "goes 16"}))
                .at(at + Duration::hours(5)),
        )
        .entities
        .into_iter()
        .find(|e| e.name == "GOES 16")
        .unwrap();
    assert!(
        (goes.lon.unwrap() + 75.2).abs() < 0.5,
        "lon {}",
        goes.lon.unwrap()
    );
    assert!(goes.lat.unwrap().abs() < 0.5, "lat {}", goes.lat.unwrap());
    let alt = goes.properties["alt_km"].as_f64().unwrap();
    assert!((alt - 35786.0).abs() < 50.0, "alt {alt}");
    assert_eq!(goes.properties["orbital_class"], "geo");
}

#[test]
fn every_satellite_gets_a_valid_position_and_old_tles_are_flagged_when_asked_for_now() {
    let r = catalog().find(&query(EarthDomain::Satellites, json!({})));
    for e in &r.entities {
        let (lat, lon) = (e.lat.unwrap(), e.lon.unwrap());
        assert!(
            lat.abs() <= 90.0 && lon.abs() <= 180.0,
            "{}: {lat},{lon}",
            e.name
        );
    }
    assert!(
        r.missing_data
            .iter()
            .any(|n| n.contains("TLE epochs are up to")),
        "{:?}",
        r.missing_data
    );
}

#[test]
fn geo_as_a_constellation_value_means_the_geosynchronous_orbital_class() {
    let by_constellation = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"constellation": "geo"}),
    ));
    let by_class = catalog().find(&query(
        EarthDomain::Satellites,
        json!({"orbital_class": "geo"}),
    ));
    assert!(by_constellation.total_matched > 300);
    assert_eq!(names(&by_constellation.entities), names(&by_class.entities));
    assert!(by_constellation
        .entities
        .iter()
        .all(|e| e.properties["orbital_class"] == "geo"));
}

/// Rows of a CSV whose `Country` column equals `country`.
fn csv_country_rows(rel: &str, country: &str) -> usize {
    let mut r = csv::Reader::from_path(data(rel)).unwrap();
    let i = r
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "Country")
        .unwrap();
    r.records()
        .filter(|rec| rec.as_ref().unwrap().get(i) == Some(country))
        .count()
}

#[test]
fn mainland_china_compute_centers_include_china_rows_and_exclude_taiwan_and_hong_kong() {
    let china_rows = csv_country_rows("compute_centers/top500_2025-06.csv", "China")
        + csv_country_rows("compute_centers/epoch_gpu_clusters.csv", "China");
    for spelling in ["中国大陆", "mainland china", "China", "中国", "PRC"] {
        let r = catalog().find(&query(
            EarthDomain::ComputeCenters,
            json!({"country": spelling}),
        ));
        let countries: HashSet<Option<&str>> =
            r.entities.iter().map(|e| e.country.as_deref()).collect();
        assert_eq!(countries, HashSet::from([Some("China")]), "{spelling}");
        // The Epoch frontier data center in Zhangbei, Hebei comes on top of
        // the TOP500 and GPU cluster rows.
        assert_eq!(r.total_matched, china_rows + 1, "{spelling}");
        assert!(names(&r.entities).contains(&"Alibaba Zhangbei"));
    }
}

#[test]
fn taiwan_and_hong_kong_compute_centers_are_found_under_their_own_names() {
    let taiwan = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"country": "台湾"}),
    ));
    let expected = csv_country_rows("compute_centers/top500_2025-06.csv", "Taiwan")
        + csv_country_rows("compute_centers/epoch_gpu_clusters.csv", "Taiwan");
    assert_eq!(taiwan.total_matched, expected);
    assert!(taiwan
        .entities
        .iter()
        .all(|e| e.country.as_deref() == Some("Taiwan")));
    let hk = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"country": "香港"}),
    ));
    assert_eq!(hk.total_matched, 4);
}

#[test]
fn compute_centers_filter_by_site_type_source_and_confirmation() {
    let top500 = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"site_type": "supercomputer", "source": "top500"}),
    ));
    assert_eq!(top500.total_matched, 500);
    let anonymised = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"source": "top500", "needs_confirmation": true, "country": "China"}),
    ));
    assert!(anonymised
        .entities
        .iter()
        .any(|e| e.properties["site"] == "Service Provider T"));
    let gpu = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"source": "epoch_ai_gpu"}),
    ));
    assert_eq!(gpu.total_matched, 786 + 17);
    let exact = catalog().find(&query(
        EarthDomain::ComputeCenters,
        json!({"location_precision": "exact"}),
    ));
    assert_eq!(exact.total_matched, 17);
    assert!(exact
        .entities
        .iter()
        .all(|e| e.properties["dataset"] == "epoch_frontier_data_centers"));
}

#[test]
fn epoch_gpu_cluster_ids_are_the_same_on_every_load() {
    let ids = |c: &EntityCatalog| -> Vec<String> {
        c.find(&query(
            EarthDomain::ComputeCenters,
            json!({"source": "epoch_ai_gpu"}),
        ))
        .entities
        .into_iter()
        .map(|e| e.entity_id)
        .collect()
    };
    let again = EntityCatalog::load(&EarthDataConfig::shipped(SHIPPED_DATA_DIR)).unwrap();
    let first = ids(catalog());
    assert_eq!(first, ids(&again));
    assert_eq!(first.iter().collect::<HashSet<_>>().len(), first.len());
}

const HONG_KONG_LANDINGS: [&str; 7] = [
    "Tseung Kwan O, China",
    "Chung Hom Kok, China",
    "Tong Fuk, China",
    "Lantau Island, China",
    "Deep Water Bay, China",
    "Cape D’Aguilar, China",
    "Chai Wan, China",
];

#[test]
fn hong_kong_landing_points_filed_under_china_are_not_mainland_china() {
    let mainland = catalog().find(&query(
        EarthDomain::Cables,
        json!({"country": "中国大陆", "kind": "landing_point"}),
    ));
    let got = names(&mainland.entities);
    assert_eq!(got.len(), 24 - 7, "{got:?}");
    assert!(got.iter().all(|n| n.ends_with(", China")));
    for hk in HONG_KONG_LANDINGS {
        assert!(!got.contains(&hk), "{hk} counted as mainland China");
    }
    let hong_kong = catalog().find(&query(
        EarthDomain::Cables,
        json!({"country": "Hong Kong", "kind": "landing_point"}),
    ));
    let mut got: Vec<&str> = names(&hong_kong.entities);
    got.sort();
    let mut want = HONG_KONG_LANDINGS.to_vec();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn cables_landing_at_a_named_point_are_found_through_inferred_landings() {
    let r = catalog().find(&query(
        EarthDomain::Cables,
        json!({"landing_point": "Tseung Kwan O", "kind": "cable"}),
    ));
    assert!(
        names(&r.entities).contains(&"Asia Pacific Gateway (APG)"),
        "{:?}",
        names(&r.entities)
    );
    assert!(r.entities.iter().all(|e| e.entity_id.starts_with("cable:")));
    assert!(r.missing_data.iter().any(|n| n.contains("inferred")));
}

#[test]
fn bgp_events_filter_by_prefix_and_asn_and_tolerate_the_row_with_an_extra_field() {
    let r = catalog().find(&query(
        EarthDomain::Bgp,
        json!({"prefix": "205.251.192.10"}),
    ));
    assert_eq!(names(&r.entities), ["amazon_1"]);
    let amazon = &r.entities[0];
    assert_eq!(amazon.entity_id, "bgp:event:amazon-1");
    assert!(amazon.properties["link"]
        .as_str()
        .unwrap()
        .starts_with("https://doublepulsar.com/"));
    assert_eq!(amazon.properties["status"], "ongoing");

    let text = std::fs::read_to_string(data("bgp/bgp_hijack_events_news_updated.csv")).unwrap();
    let with_asn = text
        .lines()
        .skip(1)
        .filter(|l| l.contains(",203959,"))
        .count();
    let r = catalog().find(&query(EarthDomain::Bgp, json!({"asn": "AS203959"})));
    assert_eq!(r.total_matched, with_asn);
    assert!(r.entities.iter().all(|e| e.properties["hijack_as"]
        .as_array()
        .unwrap()
        .contains(&json!(203959))));
}

#[test]
fn bgp_region_filter_matches_nothing_and_says_the_source_lacks_it() {
    let r = catalog().find(&query(EarthDomain::Bgp, json!({"region": "Asia"})));
    assert_eq!(r.total_matched, 0);
    assert!(r.missing_data.iter().any(|n| n.contains("no region")));
}

#[test]
fn a_filter_with_an_unknown_key_is_rejected_naming_it() {
    let err = EntityQuery::from_tool_arguments(json!({
        "domain": "satellites",
        "filters": {"constellation": "beidou", "planet": "mars"}
    }))
    .unwrap_err();
    assert!(matches!(err, EntityError::InvalidQuery { .. }));
    assert!(err.to_string().contains("planet"), "{err}");
}

#[test]
fn a_filter_that_does_not_apply_to_the_domain_is_rejected_naming_it() {
    let err = EntityQuery::from_tool_arguments(json!({
        "domain": "satellites",
        "filters": {"site_type": "gpu_cluster"}
    }))
    .unwrap_err();
    match err {
        EntityError::InvalidQuery { field, .. } => assert_eq!(field, "filters.site_type"),
        other => panic!("{other}"),
    }
    let err =
        EntityQuery::from_tool_arguments(json!({"domain": "bgp", "limit": 9000})).unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
}

#[test]
fn filters_schema_lists_exactly_the_filter_fields() {
    let schema = EntityFilters::json_schema();
    let in_schema: HashSet<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let all = EntityFilters {
        constellation: Some(Constellation::Beidou),
        name_contains: Some("x".into()),
        norad_id: Some(1),
        country: Some("x".into()),
        region: Some("x".into()),
        operator: Some("x".into()),
        orbital_class: Some("leo".parse().unwrap()),
        site_type: Some("gpu_cluster".parse().unwrap()),
        source: Some("x".into()),
        needs_confirmation: Some(true),
        location_precision: Some("exact".parse().unwrap()),
        severity: Some("high".parse().unwrap()),
        status: Some("x".into()),
        category: Some("x".into()),
        collector: Some("x".into()),
        prefix: Some("10.0.0.0/8".into()),
        asn: Some(1),
        vessel_type: Some("x".into()),
        landing_point: Some("x".into()),
        kind: Some(EntityKind::Cable),
    };
    let serialized = serde_json::to_value(&all).unwrap();
    let in_struct: HashSet<&str> = serialized
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(in_schema, in_struct);
    assert_eq!(schema["additionalProperties"], false);
    // Every serialized filter round-trips through the strict parser.
    let back: EntityFilters = serde_json::from_value(serialized).unwrap();
    assert_eq!(back, all);
}

#[test]
fn tool_schema_accepts_the_seed_example_and_refuses_unknown_filters() {
    let validator = jsonschema::validator_for(&EntityQuery::json_schema()).expect("valid schema");
    let seed_example = json!({
        "domain": "satellites",
        "filters": {"constellation": "beidou"},
        "limit": 500
    });
    assert!(validator.is_valid(&seed_example));
    assert!(EntityQuery::from_tool_arguments(seed_example).is_ok());
    for bad in [
        json!({"domain": "satellites", "filters": {"planet": "mars"}}),
        json!({"domain": "oceans"}),
        json!({"domain": "satellites", "limit": 5001}),
        json!({"domain": "compute_centers", "filters": {"site_type": "mainframe"}}),
    ] {
        assert!(!validator.is_valid(&bad), "schema accepted {bad}");
        assert!(
            EntityQuery::from_tool_arguments(bad.clone()).is_err(),
            "parser accepted {bad}"
        );
    }
}

#[test]
fn the_catalog_can_be_shared_between_threads() {
    fn shared<T: Send + Sync + 'static>(_: &T) {}
    shared(catalog());
}

#[test]
fn news_without_a_source_is_empty_with_a_missing_data_note() {
    let r = catalog().find(&query(EarthDomain::News, json!({"region": "Asia"})));
    assert!(r.entities.is_empty());
    assert_eq!(r.total_matched, 0);
    assert!(r
        .missing_data
        .iter()
        .any(|n| n == "no data source configured for news"));
}

#[test]
fn stats_count_every_shipped_record() {
    let s = catalog().stats();
    assert_eq!(s.counts[&EarthDomain::Satellites], 3159);
    assert_eq!(s.counts[&EarthDomain::ComputeCenters], 500 + 786 + 17);
    assert_eq!(s.counts[&EarthDomain::Bgp], 35);
    assert_eq!(s.counts[&EarthDomain::Cables], 693 + 1910);
    assert_eq!(
        s.unconfigured,
        vec![EarthDomain::News, EarthDomain::Vessels]
    );
    let (oldest, newest) = s.tle_epoch_range.unwrap();
    assert!(oldest.format("%Y-%m").to_string() == "2020-10" && newest >= oldest);
}

#[test]
fn a_missing_file_fails_the_load_naming_the_path() {
    let cfg = EarthDataConfig {
        top500_csv: Some(data("compute_centers/no_such_list.csv")),
        ..Default::default()
    };
    let err = EntityCatalog::load(&cfg).unwrap_err();
    assert!(err.to_string().contains("no_such_list.csv"), "{err}");
}

fn vessels_feature_collection() -> serde_json::Value {
    json!({
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "properties": {"name": "PACIFIC TANKER", "mmsi": 477000001,
                "vessel_type": "Tanker", "country": "Hong Kong", "status": "underway"},
             "geometry": {"type": "Point", "coordinates": [114.2, 22.3]}},
            {"type": "Feature", "properties": {"name": "COSCO CARGO", "mmsi": 413000002,
                "vessel_type": "Cargo", "country": "China", "status": "moored"},
             "geometry": {"type": "Point", "coordinates": [121.5, 31.2]}},
            {"type": "Feature", "id": "v-3", "properties": {"name": "NORDIC TANKER",
                "vessel_type": "Crude Oil Tanker", "country": "Norway"},
             "geometry": {"type": "Point", "coordinates": [5.3, 60.4]}}
        ]
    })
}

#[tokio::test]
async fn vessels_geojson_fetched_over_http_loads_and_filters_by_vessel_type() {
    let app = axum::Router::new().route(
        "/api/v1/visualization/geo/vessels",
        axum::routing::get(|| async { axum::Json(vessels_feature_collection()) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let cfg = EarthDataConfig {
        vessels: Some(GeoJsonSource::Url(format!(
            "http://{addr}/api/v1/visualization/geo/vessels"
        ))),
        ..Default::default()
    };
    let cat = EntityCatalog::load_with_remote(&cfg).await.unwrap();
    server.abort();

    let tankers = cat.find(&query(
        EarthDomain::Vessels,
        json!({"vessel_type": "tanker"}),
    ));
    assert_eq!(
        names(&tankers.entities),
        ["NORDIC TANKER", "PACIFIC TANKER"]
    );
    let ids: Vec<&str> = tankers
        .entities
        .iter()
        .map(|e| e.entity_id.as_str())
        .collect();
    assert_eq!(ids, ["vessel:v-3", "vessel:mmsi:477000001"]);
    assert!(cat.contains("vessel:mmsi:413000002"));
    assert!(
        tankers.missing_data.is_empty(),
        "{:?}",
        tankers.missing_data
    );

    // The flag "China" gives no region detail: matched conservatively, with a note.
    let chinese = cat.find(&query(EarthDomain::Vessels, json!({"country": "中国"})));
    assert_eq!(names(&chinese.entities), ["COSCO CARGO"]);
    assert!(chinese.missing_data.iter().any(|n| n.contains("Hong Kong")));
}

#[tokio::test]
async fn an_unreachable_remote_source_leaves_its_domain_empty_with_a_note() {
    // Bind then drop a listener to get a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = EarthDataConfig {
        news: Some(GeoJsonSource::Url(format!("http://127.0.0.1:{port}/news"))),
        http_timeout_ms: 2000,
        ..Default::default()
    };
    let cat = EntityCatalog::load_with_remote(&cfg).await.unwrap();
    let r = cat.find(&EntityQuery::new(EarthDomain::News));
    assert!(r.entities.is_empty());
    assert!(
        r.missing_data
            .iter()
            .any(|n| n.contains("news source unavailable")),
        "{:?}",
        r.missing_data
    );
}

#[tokio::test]
async fn only_http_and_https_sources_are_fetched() {
    let cfg = EarthDataConfig {
        news: Some(GeoJsonSource::Url("file:///etc/passwd".into())),
        ..Default::default()
    };
    let cat = EntityCatalog::load_with_remote(&cfg).await.unwrap();
    let r = cat.find(&EntityQuery::new(EarthDomain::News));
    assert!(r.entities.is_empty());
    assert!(
        r.missing_data
            .iter()
            .any(|n| n.contains("only http and https")),
        "{:?}",
        r.missing_data
    );
}
