//! Regions the Earth command understands by name (Chinese and English), with
//! the country filter they stand for and a camera position for `focus_view`.
//!
//! The filter value is the ISO 3166-1 alpha-2 code in upper case, which the
//! entity service reads as exactly that country (`CN` is mainland China
//! only; Hong Kong, Macau and Taiwan are `HK`, `MO`, `TW`).

/// A named region.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Region {
    /// ISO code, also the `country` filter value.
    pub code: &'static str,
    /// Display names.
    pub zh: &'static str,
    pub en: &'static str,
    /// Names recognised in commands: Chinese (substring match) and English
    /// (lowercase, matched on word boundaries).
    pub names_zh: &'static [&'static str],
    pub names_en: &'static [&'static str],
    /// Camera target, degrees.
    pub lat: f64,
    pub lon: f64,
    /// Camera altitude that shows the whole region, km.
    pub altitude_km: f64,
}

macro_rules! region {
    ($code:literal, $zh:literal, $en:literal, [$($nz:literal),*], [$($ne:literal),*], $lat:expr, $lon:expr, $alt:expr) => {
        Region { code: $code, zh: $zh, en: $en, names_zh: &[$($nz),*], names_en: &[$($ne),*],
                 lat: $lat, lon: $lon, altitude_km: $alt }
    };
}

/// Every known region.
pub const REGIONS: &[Region] = &[
    region!(
        "CN",
        "中国大陆",
        "mainland China",
        [
            "中国大陆",
            "中國大陸",
            "中国内地",
            "大陆",
            "内地",
            "中国",
            "中國",
            "国内"
        ],
        [
            "mainland china",
            "chinese mainland",
            "china mainland",
            "china",
            "prc"
        ],
        35.0,
        104.0,
        5500.0
    ),
    region!(
        "HK",
        "香港",
        "Hong Kong",
        ["中国香港", "香港"],
        ["hong kong", "hongkong"],
        22.32,
        114.17,
        120.0
    ),
    region!(
        "MO",
        "澳门",
        "Macau",
        ["中国澳门", "澳门", "澳門"],
        ["macau", "macao"],
        22.19,
        113.55,
        60.0
    ),
    region!(
        "TW",
        "台湾",
        "Taiwan",
        ["中国台湾", "台湾", "臺灣", "台灣"],
        ["taiwan"],
        23.7,
        120.96,
        700.0
    ),
    region!(
        "US",
        "美国",
        "the United States",
        ["美国", "美國"],
        ["united states", "usa", "u.s.", "us", "america"],
        39.8,
        -98.6,
        6000.0
    ),
    region!(
        "JP",
        "日本",
        "Japan",
        ["日本"],
        ["japan"],
        36.2,
        138.3,
        2000.0
    ),
    region!(
        "KR",
        "韩国",
        "South Korea",
        ["韩国", "韓國", "南韩"],
        ["south korea", "korea"],
        36.5,
        127.8,
        900.0
    ),
    region!(
        "IN",
        "印度",
        "India",
        ["印度"],
        ["india"],
        22.0,
        79.0,
        4000.0
    ),
    region!(
        "RU",
        "俄罗斯",
        "Russia",
        ["俄罗斯", "俄羅斯"],
        ["russia"],
        61.5,
        105.3,
        8000.0
    ),
    region!(
        "DE",
        "德国",
        "Germany",
        ["德国", "德國"],
        ["germany"],
        51.2,
        10.4,
        1200.0
    ),
    region!(
        "FR",
        "法国",
        "France",
        ["法国", "法國"],
        ["france"],
        46.6,
        2.2,
        1300.0
    ),
    region!(
        "GB",
        "英国",
        "the United Kingdom",
        ["英国", "英國"],
        ["united kingdom", "britain", "uk", "england"],
        54.0,
        -2.0,
        1200.0
    ),
    region!(
        "IT",
        "意大利",
        "Italy",
        ["意大利"],
        ["italy"],
        42.8,
        12.6,
        1300.0
    ),
    region!(
        "ES",
        "西班牙",
        "Spain",
        ["西班牙"],
        ["spain"],
        40.3,
        -3.7,
        1300.0
    ),
    region!(
        "NL",
        "荷兰",
        "the Netherlands",
        ["荷兰", "荷蘭"],
        ["netherlands", "holland"],
        52.1,
        5.3,
        500.0
    ),
    region!(
        "CH",
        "瑞士",
        "Switzerland",
        ["瑞士"],
        ["switzerland"],
        46.8,
        8.2,
        500.0
    ),
    region!(
        "SE",
        "瑞典",
        "Sweden",
        ["瑞典"],
        ["sweden"],
        62.0,
        15.0,
        2000.0
    ),
    region!(
        "FI",
        "芬兰",
        "Finland",
        ["芬兰", "芬蘭"],
        ["finland"],
        64.0,
        26.0,
        1800.0
    ),
    region!(
        "NO",
        "挪威",
        "Norway",
        ["挪威"],
        ["norway"],
        64.5,
        12.0,
        2000.0
    ),
    region!(
        "CA",
        "加拿大",
        "Canada",
        ["加拿大"],
        ["canada"],
        56.1,
        -106.3,
        7000.0
    ),
    region!(
        "AU",
        "澳大利亚",
        "Australia",
        ["澳大利亚", "澳洲"],
        ["australia"],
        -25.3,
        133.8,
        5500.0
    ),
    region!(
        "BR",
        "巴西",
        "Brazil",
        ["巴西"],
        ["brazil"],
        -14.2,
        -51.9,
        5500.0
    ),
    region!(
        "SG",
        "新加坡",
        "Singapore",
        ["新加坡"],
        ["singapore"],
        1.35,
        103.82,
        80.0
    ),
    region!(
        "SA",
        "沙特阿拉伯",
        "Saudi Arabia",
        ["沙特阿拉伯", "沙特"],
        ["saudi arabia", "saudi"],
        23.9,
        45.1,
        2500.0
    ),
    region!(
        "AE",
        "阿联酋",
        "the United Arab Emirates",
        ["阿联酋", "阿拉伯联合酋长国"],
        ["united arab emirates", "uae"],
        23.4,
        53.8,
        700.0
    ),
    region!(
        "IL",
        "以色列",
        "Israel",
        ["以色列"],
        ["israel"],
        31.0,
        34.9,
        500.0
    ),
    region!(
        "ID",
        "印度尼西亚",
        "Indonesia",
        ["印度尼西亚", "印尼"],
        ["indonesia"],
        -2.5,
        118.0,
        5000.0
    ),
    region!(
        "MY",
        "马来西亚",
        "Malaysia",
        ["马来西亚", "馬來西亞"],
        ["malaysia"],
        4.2,
        102.0,
        1800.0
    ),
    region!(
        "VN",
        "越南",
        "Vietnam",
        ["越南"],
        ["vietnam", "viet nam"],
        16.0,
        107.8,
        1800.0
    ),
    region!(
        "PL",
        "波兰",
        "Poland",
        ["波兰", "波蘭"],
        ["poland"],
        52.0,
        19.1,
        1100.0
    ),
];

/// The region with this code or name (any language, case-insensitive), for
/// validating `focus_view.region`.
pub fn find_region(name: &str) -> Option<&'static Region> {
    let t = name.trim();
    let lc = t.to_lowercase();
    REGIONS.iter().find(|r| {
        r.code.eq_ignore_ascii_case(t)
            || r.zh == t
            || r.en.to_lowercase() == lc
            || r.names_zh.contains(&t)
            || r.names_en.contains(&lc.as_str())
    })
}

/// True when the byte range `start..end` of `text` is not inside a longer
/// ASCII word.
pub(crate) fn on_word_boundary(text: &str, start: usize, end: usize) -> bool {
    let before = text[..start].chars().next_back();
    let after = text[end..].chars().next();
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !is_word(before) && !is_word(after)
}

/// Every region named in `text_lc` (already lowercase) with the byte range
/// of its name: the longest name wins where names overlap ("中国台湾" is
/// Taiwan, not China; "印度尼西亚" is Indonesia, not India).
pub fn scan_regions(text_lc: &str) -> Vec<(&'static Region, usize, usize)> {
    let mut hits: Vec<(&'static Region, usize, usize)> = Vec::new();
    for r in REGIONS {
        for n in r.names_zh {
            for (i, _) in text_lc.match_indices(n) {
                hits.push((r, i, i + n.len()));
            }
        }
        for n in r.names_en {
            for (i, _) in text_lc.match_indices(n) {
                if on_word_boundary(text_lc, i, i + n.len()) {
                    hits.push((r, i, i + n.len()));
                }
            }
        }
    }
    // Longest first, then earliest; keep hits that overlap no kept hit.
    hits.sort_by(|a, b| (b.2 - b.1).cmp(&(a.2 - a.1)).then(a.1.cmp(&b.1)));
    let mut kept: Vec<(&'static Region, usize, usize)> = Vec::new();
    for h in hits {
        if kept.iter().all(|k| h.2 <= k.1 || h.1 >= k.2) {
            kept.push(h);
        }
    }
    kept.sort_by_key(|k| k.1);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_region_name_wins() {
        let hits = scan_regions("中国台湾的算力中心");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].0.code, "TW");
        assert_eq!(scan_regions("印度尼西亚")[0].0.code, "ID");
        assert_eq!(scan_regions("中国大陆的算力中心")[0].0.code, "CN");
    }

    #[test]
    fn english_names_match_whole_words_only() {
        assert!(scan_regions("show business centers").is_empty());
        assert_eq!(scan_regions("data centers in the us")[0].0.code, "US");
        assert_eq!(
            scan_regions("compute centers in mainland china")[0].0.code,
            "CN"
        );
    }

    #[test]
    fn regions_are_found_by_code_and_names() {
        assert_eq!(find_region("cn").unwrap().code, "CN");
        assert_eq!(find_region("中国大陆").unwrap().code, "CN");
        assert_eq!(find_region("Mainland China").unwrap().code, "CN");
        assert!(find_region("Atlantis").is_none());
    }
}
