//! Country and region matching (docs/earth-command.md, "Earth data").
//!
//! Every record's country text is classified once at load into a [`Place`]:
//! an ISO 3166-1 alpha-2 code when the name is in the alias table, plus the
//! normalized source text for everything else. Queries are parsed once into a
//! [`CountryQuery`], so matching at query time is a code or string compare.
//!
//! China is split four ways: `CN` means mainland China and
//! `HK`, `MO` and `TW` are kept apart from it. A record that says only
//! "China" but whose fields could hide Hong Kong, Macau or Taiwan is marked
//! [`Place::china_ambiguous`]: it still matches a mainland query (the
//! conservative rule) and the query result carries a missing-data note.

/// One row of the alias table: ISO code, English/Chinese names (already
/// normalized: lowercase, single spaces), continent, approximate centroid.
struct CountryAlias {
    code: &'static str,
    /// The display name used when a record has no country text of its own.
    display: &'static str,
    names: &'static [&'static str],
    continent: Continent,
    /// Rough geographic centre (lat, lon) in degrees, for records located
    /// only to country precision.
    centroid: (f64, f64),
}

/// Continents, for `region` filters such as "Asia" or "欧洲".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Continent {
    Asia,
    Europe,
    NorthAmerica,
    SouthAmerica,
    Africa,
    Oceania,
}

impl Continent {
    fn parse(normalized: &str) -> Option<Continent> {
        Some(match normalized {
            "asia" | "亚洲" | "亞洲" => Continent::Asia,
            "europe" | "欧洲" | "歐洲" => Continent::Europe,
            "north america" | "北美" | "北美洲" => Continent::NorthAmerica,
            "south america" | "latin america" | "南美" | "南美洲" | "拉美" => {
                Continent::SouthAmerica
            }
            "africa" | "非洲" => Continent::Africa,
            "oceania" | "australia and oceania" | "大洋洲" => Continent::Oceania,
            _ => return None,
        })
    }
}

const ALIASES: &[CountryAlias] = &[
    CountryAlias {
        code: "CN",
        display: "China",
        names: &[
            "china",
            "mainland china",
            "china mainland",
            "chinese mainland",
            "china (mainland)",
            "people's republic of china",
            "peoples republic of china",
            "the people's republic of china",
            "prc",
            "p.r. china",
            "pr china",
            "chn",
            "中国",
            "中國",
            "中国大陆",
            "中國大陸",
            "大陆",
            "中华人民共和国",
            "中華人民共和國",
        ],
        continent: Continent::Asia,
        centroid: (35.0, 105.0),
    },
    CountryAlias {
        code: "HK",
        display: "Hong Kong",
        names: &[
            "hong kong",
            "hongkong",
            "hong kong sar",
            "hong kong sar china",
            "hong kong, china",
            "hkg",
            "香港",
            "中国香港",
            "中國香港",
        ],
        continent: Continent::Asia,
        centroid: (22.32, 114.17),
    },
    CountryAlias {
        code: "MO",
        display: "Macau",
        names: &[
            "macau",
            "macao",
            "macau sar",
            "macao sar",
            "macau, china",
            "mac",
            "澳门",
            "澳門",
            "中国澳门",
        ],
        continent: Continent::Asia,
        centroid: (22.17, 113.55),
    },
    CountryAlias {
        code: "TW",
        display: "Taiwan",
        names: &[
            "taiwan",
            "taiwan, china",
            "taiwan province of china",
            "chinese taipei",
            "twn",
            "台湾",
            "臺灣",
            "台灣",
            "中国台湾",
        ],
        continent: Continent::Asia,
        centroid: (23.7, 121.0),
    },
    CountryAlias {
        code: "US",
        display: "United States",
        names: &[
            "united states",
            "united states of america",
            "usa",
            "u.s.",
            "u.s.a.",
            "america",
            "美国",
            "美國",
        ],
        continent: Continent::NorthAmerica,
        centroid: (39.8, -98.6),
    },
    CountryAlias {
        code: "JP",
        display: "Japan",
        names: &["japan", "jpn", "日本"],
        continent: Continent::Asia,
        centroid: (36.2, 138.3),
    },
    CountryAlias {
        code: "DE",
        display: "Germany",
        names: &["germany", "deu", "德国", "德國"],
        continent: Continent::Europe,
        centroid: (51.2, 10.4),
    },
    CountryAlias {
        code: "FR",
        display: "France",
        names: &["france", "fra", "法国", "法國"],
        continent: Continent::Europe,
        centroid: (46.6, 2.2),
    },
    CountryAlias {
        code: "GB",
        display: "United Kingdom",
        names: &[
            "united kingdom",
            "united kingdom of great britain and northern ireland",
            "uk",
            "great britain",
            "britain",
            "gbr",
            "英国",
            "英國",
        ],
        continent: Continent::Europe,
        centroid: (54.0, -2.5),
    },
    CountryAlias {
        code: "KR",
        display: "South Korea",
        names: &[
            "south korea",
            "korea",
            "republic of korea",
            "korea (republic of)",
            "korea, republic of",
            "korea, south",
            "kor",
            "韩国",
            "韓國",
            "南韩",
        ],
        continent: Continent::Asia,
        centroid: (36.5, 127.9),
    },
    CountryAlias {
        code: "IN",
        display: "India",
        names: &["india", "ind", "印度"],
        continent: Continent::Asia,
        centroid: (22.0, 79.0),
    },
    CountryAlias {
        code: "RU",
        display: "Russia",
        names: &["russia", "russian federation", "rus", "俄罗斯", "俄羅斯"],
        continent: Continent::Europe,
        centroid: (61.5, 105.3),
    },
    CountryAlias {
        code: "CA",
        display: "Canada",
        names: &["canada", "can", "加拿大"],
        continent: Continent::NorthAmerica,
        centroid: (56.1, -106.3),
    },
    CountryAlias {
        code: "AU",
        display: "Australia",
        names: &["australia", "aus", "澳大利亚", "澳洲"],
        continent: Continent::Oceania,
        centroid: (-25.3, 133.8),
    },
    CountryAlias {
        code: "BR",
        display: "Brazil",
        names: &["brazil", "bra", "巴西"],
        continent: Continent::SouthAmerica,
        centroid: (-14.2, -51.9),
    },
    CountryAlias {
        code: "IT",
        display: "Italy",
        names: &["italy", "ita", "意大利"],
        continent: Continent::Europe,
        centroid: (41.9, 12.6),
    },
    CountryAlias {
        code: "ES",
        display: "Spain",
        names: &["spain", "esp", "西班牙"],
        continent: Continent::Europe,
        centroid: (40.5, -3.7),
    },
    CountryAlias {
        code: "NL",
        display: "Netherlands",
        names: &[
            "netherlands",
            "the netherlands",
            "holland",
            "nld",
            "荷兰",
            "荷蘭",
        ],
        continent: Continent::Europe,
        centroid: (52.1, 5.3),
    },
    CountryAlias {
        code: "SE",
        display: "Sweden",
        names: &["sweden", "swe", "瑞典"],
        continent: Continent::Europe,
        centroid: (60.1, 18.6),
    },
    CountryAlias {
        code: "CH",
        display: "Switzerland",
        names: &["switzerland", "che", "瑞士"],
        continent: Continent::Europe,
        centroid: (46.8, 8.2),
    },
    CountryAlias {
        code: "NO",
        display: "Norway",
        names: &["norway", "nor", "挪威"],
        continent: Continent::Europe,
        centroid: (60.5, 8.5),
    },
    CountryAlias {
        code: "FI",
        display: "Finland",
        names: &["finland", "fin", "芬兰", "芬蘭"],
        continent: Continent::Europe,
        centroid: (61.9, 25.7),
    },
    CountryAlias {
        code: "PL",
        display: "Poland",
        names: &["poland", "pol", "波兰", "波蘭"],
        continent: Continent::Europe,
        centroid: (51.9, 19.1),
    },
    CountryAlias {
        code: "SG",
        display: "Singapore",
        names: &["singapore", "sgp", "新加坡"],
        continent: Continent::Asia,
        centroid: (1.35, 103.8),
    },
    CountryAlias {
        code: "SA",
        display: "Saudi Arabia",
        names: &["saudi arabia", "sau", "沙特", "沙特阿拉伯"],
        continent: Continent::Asia,
        centroid: (23.9, 45.1),
    },
    CountryAlias {
        code: "AE",
        display: "United Arab Emirates",
        names: &[
            "united arab emirates",
            "uae",
            "are",
            "阿联酋",
            "阿拉伯联合酋长国",
        ],
        continent: Continent::Asia,
        centroid: (23.4, 53.8),
    },
    CountryAlias {
        code: "IL",
        display: "Israel",
        names: &["israel", "isr", "以色列"],
        continent: Continent::Asia,
        centroid: (31.0, 34.9),
    },
    CountryAlias {
        code: "MY",
        display: "Malaysia",
        names: &["malaysia", "mys", "马来西亚", "馬來西亞"],
        continent: Continent::Asia,
        centroid: (4.2, 102.0),
    },
    CountryAlias {
        code: "TH",
        display: "Thailand",
        names: &["thailand", "tha", "泰国", "泰國"],
        continent: Continent::Asia,
        centroid: (15.9, 101.0),
    },
    CountryAlias {
        code: "VN",
        display: "Vietnam",
        names: &["vietnam", "viet nam", "vnm", "越南"],
        continent: Continent::Asia,
        centroid: (14.1, 108.3),
    },
    CountryAlias {
        code: "PH",
        display: "Philippines",
        names: &[
            "philippines",
            "philippines (the)",
            "phl",
            "菲律宾",
            "菲律賓",
        ],
        continent: Continent::Asia,
        centroid: (12.9, 121.8),
    },
    CountryAlias {
        code: "ID",
        display: "Indonesia",
        names: &["indonesia", "idn", "印度尼西亚", "印尼"],
        continent: Continent::Asia,
        centroid: (-0.8, 113.9),
    },
    CountryAlias {
        code: "TR",
        display: "Turkey",
        names: &["turkey", "türkiye", "turkiye", "tur", "土耳其"],
        continent: Continent::Asia,
        centroid: (39.0, 35.2),
    },
    CountryAlias {
        code: "EG",
        display: "Egypt",
        names: &["egypt", "egy", "埃及"],
        continent: Continent::Africa,
        centroid: (26.8, 30.8),
    },
    CountryAlias {
        code: "IR",
        display: "Iran",
        names: &["iran", "islamic republic of iran", "irn", "伊朗"],
        continent: Continent::Asia,
        centroid: (32.4, 53.7),
    },
    CountryAlias {
        code: "PK",
        display: "Pakistan",
        names: &["pakistan", "pak", "巴基斯坦"],
        continent: Continent::Asia,
        centroid: (30.4, 69.3),
    },
    CountryAlias {
        // Not a country, but the owner of Galileo.
        code: "EU",
        display: "European Union",
        names: &["european union", "欧盟", "歐盟"],
        continent: Continent::Europe,
        centroid: (50.1, 9.0),
    },
    CountryAlias {
        code: "KP",
        display: "North Korea",
        names: &[
            "north korea",
            "democratic people's republic of korea",
            "prk",
            "朝鲜",
            "朝鮮",
        ],
        continent: Continent::Asia,
        centroid: (40.3, 127.5),
    },
];

/// Mainland China, Hong Kong, Macau and Taiwan codes, for "greater China"
/// queries.
const GREATER_CHINA: &[&str] = &["CN", "HK", "MO", "TW"];

/// Hong Kong landing points that TeleGeography names ", China"
/// (shipped `landing-point-geo.json`; normalized, apostrophes straightened).
const HONG_KONG_LANDING_NAMES: &[&str] = &[
    "tseung kwan o",
    "chung hom kok",
    "tong fuk",
    "lantau island",
    "deep water bay",
    "cape d'aguilar",
    "chai wan",
];

/// Lowercases, trims, straightens typographic apostrophes, collapses runs of
/// whitespace and drops a leading "the ". Chinese text passes through.
pub(crate) fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        for ch in word.chars() {
            match ch {
                '\u{2019}' | '\u{2018}' | '`' => out.push('\''),
                c => out.extend(c.to_lowercase()),
            }
        }
    }
    match out.strip_prefix("the ") {
        Some(rest) if !rest.is_empty() => rest.to_owned(),
        _ => out,
    }
}

fn alias_by_code(code: &str) -> Option<&'static CountryAlias> {
    ALIASES.iter().find(|a| a.code == code)
}

fn alias_by_name(normalized: &str) -> Option<&'static CountryAlias> {
    ALIASES.iter().find(|a| a.names.contains(&normalized))
}

/// Where a record is, as far as its own fields say.
#[derive(Debug, Clone, Default)]
pub(crate) struct Place {
    /// ISO 3166-1 alpha-2 code when the country is in the alias table;
    /// `CN` is mainland China only.
    pub code: Option<&'static str>,
    /// The record's country text, normalized; empty when it has none.
    pub text_lc: String,
    /// True when the record says "China" and nothing in its fields can tell
    /// mainland China from Hong Kong, Macau or Taiwan.
    pub china_ambiguous: bool,
    /// Continent from the source when it has one (TOP500), else from `code`.
    pub continent: Option<Continent>,
    /// Free-text region from the source (news `region`, TOP500 continent),
    /// normalized.
    pub region_lc: String,
}

impl Place {
    /// Classifies a source's country text. `china_is_exact` says whether the
    /// source spells Hong Kong, Macau and Taiwan separately (TOP500, Epoch),
    /// in which case a bare "China" is mainland China.
    pub fn from_country(text: &str, china_is_exact: bool) -> Place {
        let text_lc = normalize(text);
        let code = alias_by_name(&text_lc).map(|a| a.code);
        Place {
            code,
            continent: code.and_then(alias_by_code).map(|a| a.continent),
            china_ambiguous: code == Some("CN") && !china_is_exact,
            text_lc,
            region_lc: String::new(),
        }
    }

    /// A place known only by ISO code (satellite constellations).
    pub fn from_code(code: &'static str) -> Place {
        let alias = alias_by_code(code);
        Place {
            code: Some(code),
            text_lc: alias.map(|a| normalize(a.display)).unwrap_or_default(),
            china_ambiguous: false,
            continent: alias.map(|a| a.continent),
            region_lc: String::new(),
        }
    }

    /// Moves a record that its source files under "China" to Hong Kong or
    /// Macau when its name is a known Hong Kong landing site or its
    /// coordinates fall in the Hong Kong or Macau boxes. Hong Kong: 113.8–114.5 E,
    /// 22.1–22.6 N; Macau: 113.52–113.60 E, 22.10–22.22 N (both boxes stop short of
    /// Zhuhai's landing point at 22.27 N, 113.58 E).
    pub fn split_china_by_site(&mut self, site_name_lc: &str, lat: Option<f64>, lon: Option<f64>) {
        if self.code != Some("CN") {
            return;
        }
        let in_box = |lat_min: f64, lat_max: f64, lon_min: f64, lon_max: f64| match (lat, lon) {
            (Some(la), Some(lo)) => {
                (lat_min..=lat_max).contains(&la) && (lon_min..=lon_max).contains(&lo)
            }
            _ => false,
        };
        let site = site_name_lc.trim();
        if HONG_KONG_LANDING_NAMES.contains(&site) || in_box(22.1, 22.6, 113.8, 114.5) {
            self.code = Some("HK");
        } else if in_box(22.10, 22.22, 113.52, 113.60) {
            self.code = Some("MO");
        } else if lat.is_some() && lon.is_some() {
            // Coordinates outside both boxes settle it: mainland.
            self.china_ambiguous = false;
            return;
        }
        if self.code != Some("CN") {
            self.china_ambiguous = false;
        }
    }

    /// Canonical English name for the classified code, if any.
    pub fn display_name(&self) -> Option<&'static str> {
        self.code.and_then(alias_by_code).map(|a| a.display)
    }

    /// Approximate centroid (lat, lon) of the classified country.
    pub fn centroid(&self) -> Option<(f64, f64)> {
        self.code.and_then(alias_by_code).map(|a| a.centroid)
    }
}

/// A parsed `country` or `region` filter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CountryQuery {
    /// One or more ISO codes (`CN` is mainland China only).
    Codes(Vec<&'static str>),
    /// A continent.
    Continent(Continent),
    /// Unrecognised text: matched against the record's normalized country
    /// (equality) and region (substring).
    Text(String),
}

/// Outcome of matching one record against a [`CountryQuery`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlaceMatch {
    No,
    Yes,
    /// Matched mainland China only conservatively: the record says "China"
    /// and cannot be told apart from Hong Kong, Macau or Taiwan.
    Ambiguous,
}

impl CountryQuery {
    /// Parses free text such as "中国大陆", "mainland china", "China", "美国",
    /// "US", "greater china", "Asia". ISO alpha-2 codes are accepted only in
    /// upper case ("US", "CN") so that words like "in" or "no" stay text.
    pub fn parse(text: &str) -> CountryQuery {
        let trimmed = text.trim();
        if trimmed.len() == 2 && trimmed.bytes().all(|b| b.is_ascii_uppercase()) {
            if let Some(a) = alias_by_code(trimmed) {
                return CountryQuery::Codes(vec![a.code]);
            }
        }
        let lc = normalize(trimmed);
        match lc.as_str() {
            "greater china" | "大中华" | "大中華" | "大中华区" | "两岸四地" => {
                return CountryQuery::Codes(GREATER_CHINA.to_vec());
            }
            "hong kong and macau" | "hong kong and macao" | "港澳" => {
                return CountryQuery::Codes(vec!["HK", "MO"]);
            }
            _ => {}
        }
        if let Some(a) = alias_by_name(&lc) {
            return CountryQuery::Codes(vec![a.code]);
        }
        if let Some(c) = Continent::parse(&lc) {
            return CountryQuery::Continent(c);
        }
        CountryQuery::Text(lc)
    }

    /// Matches a record's place as a `country` filter.
    pub fn match_country(&self, place: &Place) -> PlaceMatch {
        match self {
            CountryQuery::Codes(codes) => match place.code {
                Some(code) if codes.contains(&code) => {
                    if code == "CN" && place.china_ambiguous {
                        PlaceMatch::Ambiguous
                    } else {
                        PlaceMatch::Yes
                    }
                }
                _ => PlaceMatch::No,
            },
            CountryQuery::Continent(c) => bool_match(place.continent == Some(*c)),
            CountryQuery::Text(t) => bool_match(!t.is_empty() && place.text_lc == *t),
        }
    }

    /// Matches a record's place as a `region` filter: like a country filter,
    /// but free text also matches the record's own region text by substring.
    pub fn match_region(&self, place: &Place) -> PlaceMatch {
        match self {
            CountryQuery::Text(t) => bool_match(
                !t.is_empty()
                    && (place.text_lc == *t
                        || (!place.region_lc.is_empty() && place.region_lc.contains(t.as_str()))),
            ),
            _ => self.match_country(place),
        }
    }
}

fn bool_match(b: bool) -> PlaceMatch {
    if b {
        PlaceMatch::Yes
    } else {
        PlaceMatch::No
    }
}

/// Parses a TOP500 `Continent` value.
pub(crate) fn parse_continent(text: &str) -> Option<Continent> {
    Continent::parse(&normalize(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mainland_china_spellings_all_parse_to_cn() {
        for q in [
            "中国大陆",
            "mainland china",
            "China",
            "中国",
            "People's Republic of China",
            "PRC",
            "CN",
        ] {
            assert_eq!(
                CountryQuery::parse(q),
                CountryQuery::Codes(vec!["CN"]),
                "{q}"
            );
        }
    }

    #[test]
    fn lowercase_two_letter_words_are_not_iso_codes() {
        assert_eq!(CountryQuery::parse("no"), CountryQuery::Text("no".into()));
        assert_eq!(CountryQuery::parse("NO"), CountryQuery::Codes(vec!["NO"]));
    }

    #[test]
    fn hong_kong_landing_point_filed_under_china_is_moved_to_hk() {
        let mut p = Place::from_country("China", false);
        p.split_china_by_site("cape d'aguilar", Some(22.208), Some(114.26));
        assert_eq!(p.code, Some("HK"));
        let mut p = Place::from_country("China", false);
        p.split_china_by_site("zhuhai", Some(22.27), Some(113.577));
        assert_eq!(p.code, Some("CN"));
        assert!(!p.china_ambiguous);
    }

    #[test]
    fn bare_china_without_region_detail_matches_mainland_only_ambiguously() {
        let p = Place::from_country("China", false);
        assert_eq!(
            CountryQuery::parse("中国大陆").match_country(&p),
            PlaceMatch::Ambiguous
        );
        assert_eq!(
            CountryQuery::parse("Hong Kong").match_country(&p),
            PlaceMatch::No
        );
    }
}
