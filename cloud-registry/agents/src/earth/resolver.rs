//! The deterministic Earth command resolver: keyword tables for the action
//! words, the six domains, satellite constellations and regions, in Chinese
//! and English. It answers when no model is configured, and is the fallback
//! when a model fails, so the Earth command always works.
//!
//! Two pure steps: [`interpret`] turns text into an [`Interpretation`]
//! (verb, domains with entity-service filters, region, name query);
//! [`build_plan`] turns the interpretation and the entity-service results
//! into actions, a summary in the input's language and missing-data notes.
//! The queries in between are run (and recorded) by the command service.

use serde::Serialize;
use shared_protocol::earth::{
    EarthAction, EarthDomain, HighlightMode, HighlightStyle, MatchedEntity, ResultPanelItem,
};

use super::entities::{
    Constellation, EntityFilters, EntityKind, EntityQuery, EntityQueryResult, SiteType,
};
use super::regions::{on_word_boundary, scan_regions, Region};

/// The language of the command, which is the language of the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lang {
    Zh,
    En,
}

/// Chinese when the text has any CJK ideograph, else English.
pub fn detect_lang(text: &str) -> Lang {
    if text
        .chars()
        .any(|c| matches!(c, '\u{4e00}'..='\u{9fff}' | '\u{3400}'..='\u{4dbf}' | '\u{f900}'..='\u{faff}'))
    {
        Lang::Zh
    } else {
        Lang::En
    }
}

/// What the operator wants done. When several action words appear, the
/// earliest variant here wins ("取消高亮" is Clear, "只显示" is Filter,
/// "显示并聚焦" is Focus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    Clear,
    Hide,
    Filter,
    Focus,
    Highlight,
    Find,
    Show,
}

const VERBS: &[(&str, Verb)] = &[
    ("取消高亮", Verb::Clear),
    ("清除", Verb::Clear),
    ("清空", Verb::Clear),
    ("重置", Verb::Clear),
    ("clear", Verb::Clear),
    ("reset", Verb::Clear),
    ("unhighlight", Verb::Clear),
    ("隐藏", Verb::Hide),
    ("关闭", Verb::Hide),
    ("关掉", Verb::Hide),
    ("hide", Verb::Hide),
    ("turn off", Verb::Hide),
    ("只显示", Verb::Filter),
    ("仅显示", Verb::Filter),
    ("筛选", Verb::Filter),
    ("过滤", Verb::Filter),
    ("filter", Verb::Filter),
    ("only show", Verb::Filter),
    ("show only", Verb::Filter),
    ("聚焦", Verb::Focus),
    ("定位", Verb::Focus),
    ("飞到", Verb::Focus),
    ("转到", Verb::Focus),
    ("缩放到", Verb::Focus),
    ("focus", Verb::Focus),
    ("zoom to", Verb::Focus),
    ("zoom in on", Verb::Focus),
    ("fly to", Verb::Focus),
    ("center on", Verb::Focus),
    ("locate", Verb::Focus),
    ("高亮", Verb::Highlight),
    ("标出", Verb::Highlight),
    ("标记", Verb::Highlight),
    ("highlight", Verb::Highlight),
    ("mark", Verb::Highlight),
    ("找出", Verb::Find),
    ("查找", Verb::Find),
    ("搜索", Verb::Find),
    ("列出", Verb::Find),
    ("查询", Verb::Find),
    ("有哪些", Verb::Find),
    ("哪些", Verb::Find),
    ("find", Verb::Find),
    ("search", Verb::Find),
    ("list", Verb::Find),
    ("which", Verb::Find),
    ("where", Verb::Find),
    ("显示", Verb::Show),
    ("展示", Verb::Show),
    ("打开", Verb::Show),
    ("看看", Verb::Show),
    ("show", Verb::Show),
    ("display", Verb::Show),
    ("open", Verb::Show),
];

/// A domain keyword and what it adds to the filters.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Extra {
    None,
    Site(SiteType),
    Kind(EntityKind),
    VesselType(&'static str),
}

const DOMAIN_WORDS: &[(&str, EarthDomain, Extra)] = &[
    ("人造卫星", EarthDomain::Satellites, Extra::None),
    ("卫星", EarthDomain::Satellites, Extra::None),
    ("星座", EarthDomain::Satellites, Extra::None),
    ("satellites", EarthDomain::Satellites, Extra::None),
    ("satellite", EarthDomain::Satellites, Extra::None),
    ("constellation", EarthDomain::Satellites, Extra::None),
    ("算力中心", EarthDomain::ComputeCenters, Extra::None),
    ("数据中心", EarthDomain::ComputeCenters, Extra::None),
    ("计算中心", EarthDomain::ComputeCenters, Extra::None),
    ("算力", EarthDomain::ComputeCenters, Extra::None),
    (
        "超算中心",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "超级计算机",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "超算",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "智算中心",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    (
        "智算",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    (
        "gpu集群",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    ("compute centers", EarthDomain::ComputeCenters, Extra::None),
    ("compute center", EarthDomain::ComputeCenters, Extra::None),
    ("compute centres", EarthDomain::ComputeCenters, Extra::None),
    (
        "computing centers",
        EarthDomain::ComputeCenters,
        Extra::None,
    ),
    ("data centers", EarthDomain::ComputeCenters, Extra::None),
    ("data center", EarthDomain::ComputeCenters, Extra::None),
    ("data centres", EarthDomain::ComputeCenters, Extra::None),
    ("datacenters", EarthDomain::ComputeCenters, Extra::None),
    (
        "supercomputers",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "supercomputer",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "supercomputing",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "hpc",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "top500",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::Supercomputer),
    ),
    (
        "gpu clusters",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    (
        "gpu cluster",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    (
        "ai clusters",
        EarthDomain::ComputeCenters,
        Extra::Site(SiteType::GpuCluster),
    ),
    ("bgp", EarthDomain::Bgp, Extra::None),
    ("路由劫持", EarthDomain::Bgp, Extra::None),
    ("路由泄露", EarthDomain::Bgp, Extra::None),
    ("前缀劫持", EarthDomain::Bgp, Extra::None),
    ("劫持事件", EarthDomain::Bgp, Extra::None),
    ("route hijacks", EarthDomain::Bgp, Extra::None),
    ("route hijack", EarthDomain::Bgp, Extra::None),
    ("prefix hijacks", EarthDomain::Bgp, Extra::None),
    ("hijacks", EarthDomain::Bgp, Extra::None),
    ("hijack", EarthDomain::Bgp, Extra::None),
    ("新闻", EarthDomain::News, Extra::None),
    ("资讯", EarthDomain::News, Extra::None),
    ("news", EarthDomain::News, Extra::None),
    ("headlines", EarthDomain::News, Extra::None),
    ("船舶", EarthDomain::Vessels, Extra::None),
    ("船只", EarthDomain::Vessels, Extra::None),
    ("舰船", EarthDomain::Vessels, Extra::None),
    ("油轮", EarthDomain::Vessels, Extra::VesselType("tanker")),
    ("货轮", EarthDomain::Vessels, Extra::VesselType("cargo")),
    ("vessels", EarthDomain::Vessels, Extra::None),
    ("vessel", EarthDomain::Vessels, Extra::None),
    ("ships", EarthDomain::Vessels, Extra::None),
    ("tankers", EarthDomain::Vessels, Extra::VesselType("tanker")),
    (
        "海底光缆",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::Cable),
    ),
    (
        "海底电缆",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::Cable),
    ),
    (
        "海缆登陆点",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::LandingPoint),
    ),
    ("海缆", EarthDomain::Cables, Extra::Kind(EntityKind::Cable)),
    ("光缆", EarthDomain::Cables, Extra::Kind(EntityKind::Cable)),
    (
        "登陆点",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::LandingPoint),
    ),
    (
        "登陆站",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::LandingPoint),
    ),
    (
        "submarine cables",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::Cable),
    ),
    (
        "undersea cables",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::Cable),
    ),
    (
        "cables",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::Cable),
    ),
    ("cable", EarthDomain::Cables, Extra::Kind(EntityKind::Cable)),
    (
        "landing points",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::LandingPoint),
    ),
    (
        "landing stations",
        EarthDomain::Cables,
        Extra::Kind(EntityKind::LandingPoint),
    ),
];

const CONSTELLATION_WORDS: &[(&str, Constellation)] = &[
    ("北斗", Constellation::Beidou),
    ("beidou", Constellation::Beidou),
    ("bds", Constellation::Beidou),
    ("gps", Constellation::Gps),
    ("navstar", Constellation::Gps),
    ("伽利略", Constellation::Galileo),
    ("galileo", Constellation::Galileo),
    ("格洛纳斯", Constellation::Glonass),
    ("glonass", Constellation::Glonass),
    ("星链", Constellation::Starlink),
    ("starlink", Constellation::Starlink),
    ("铱星", Constellation::Iridium),
    ("iridium", Constellation::Iridium),
    ("oneweb", Constellation::Oneweb),
    ("地球同步", Constellation::Geo),
    ("同步轨道", Constellation::Geo),
    ("静止轨道", Constellation::Geo),
    ("geostationary", Constellation::Geo),
    ("geosynchronous", Constellation::Geo),
    ("geo", Constellation::Geo),
    ("低轨", Constellation::Leo),
    ("近地轨道", Constellation::Leo),
    ("low earth orbit", Constellation::Leo),
    ("leo", Constellation::Leo),
    ("中轨", Constellation::Meo),
    ("meo", Constellation::Meo),
];

/// Well-known single objects: name → (domain, `name_contains` value).
const ALIASES: &[(&str, EarthDomain, &str)] = &[
    ("国际空间站", EarthDomain::Satellites, "iss (zarya)"),
    (
        "international space station",
        EarthDomain::Satellites,
        "iss (zarya)",
    ),
    ("iss", EarthDomain::Satellites, "iss (zarya)"),
    ("哈勃", EarthDomain::Satellites, "hst"),
    ("hubble", EarthDomain::Satellites, "hst"),
];

const STOP_ZH: &[&str] = &[
    "所有", "全部", "全体", "一下", "请", "帮我", "给我", "把", "的", "在", "上空", "上", "里",
    "中", "内", "位于", "个", "颗", "条", "艘", "和", "与", "及", "并且", "并", "图层", "层",
    "位置", "地图", "对象", "相关", "一些", "哪里", "吗", "呢", "了", "吧", "出来", "都", "那些",
    "这些", "区域", "地区", "当前", "现在", "目前", "我想", "我要", "看", "一共", "全球", "世界",
    "范围", "附近", "周边", "系统", "情况",
];

const STOP_EN: &[&str] = &[
    "all",
    "the",
    "a",
    "an",
    "of",
    "in",
    "on",
    "to",
    "me",
    "please",
    "layer",
    "layers",
    "every",
    "and",
    "for",
    "from",
    "at",
    "with",
    "my",
    "some",
    "any",
    "located",
    "based",
    "that",
    "are",
    "is",
    "there",
    "what",
    "map",
    "globe",
    "world",
    "around",
    "near",
    "inside",
    "within",
    "over",
    "currently",
    "now",
    "i",
    "want",
    "see",
    "can",
    "you",
    "let",
    "up",
    "them",
    "it",
    "its",
    "entire",
    "whole",
    "just",
    "also",
    "then",
];

/// One domain the command is about, with its entity-service filters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainIntent {
    pub domain: EarthDomain,
    pub filters: EntityFilters,
}

impl DomainIntent {
    /// True when any filter narrows the domain.
    pub fn is_narrowed(&self) -> bool {
        narrows(&self.filters)
    }
}

/// True when `f` selects part of a layer. `kind: cable` alone does not:
/// it is what the word 海缆/cables implies, and the cables layer is what
/// "打开海缆图层" turns on.
fn narrows(f: &EntityFilters) -> bool {
    f.set_fields()
        .into_iter()
        .any(|n| !(n == "kind" && f.kind == Some(EntityKind::Cable)))
}

/// What a command means, before any data is looked at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interpretation {
    pub lang: Lang,
    pub verb: Option<Verb>,
    /// Domains named (or implied by a constellation or alias), in order.
    pub domains: Vec<DomainIntent>,
    /// Region code, when one was named.
    pub region: Option<&'static str>,
    /// Text left after every known word: searched in entity names.
    pub name_query: Option<String>,
    /// How a summary names what `name_query` searches: the well-known
    /// name as written (`国际空间站`, `iss`) when `name_query` is its
    /// catalogue spelling (`iss (zarya)`), otherwise `name_query` itself.
    pub name_label: Option<String>,
    /// True when no domain was named but a name query must be tried on
    /// every domain ([`probe_domains`]).
    pub probe: bool,
}

impl Interpretation {
    /// The named region.
    pub fn region(&self) -> Option<&'static Region> {
        self.region
            .and_then(|c| super::regions::REGIONS.iter().find(|r| r.code == c))
    }

    /// True when there is something to act on.
    pub fn is_actionable(&self) -> bool {
        match self.verb {
            Some(Verb::Clear) => true,
            Some(Verb::Hide) => !self.domains.is_empty(),
            Some(Verb::Focus) => !self.domains.is_empty() || self.region.is_some() || self.probe,
            _ => !self.domains.is_empty() || self.probe,
        }
    }
}

/// Domains a bare name is searched in, in order.
pub const PROBE_ORDER: [EarthDomain; 6] = [
    EarthDomain::Satellites,
    EarthDomain::ComputeCenters,
    EarthDomain::Cables,
    EarthDomain::Bgp,
    EarthDomain::Vessels,
    EarthDomain::News,
];

/// Lowercase, full-width ASCII folded to half-width, whitespace collapsed.
fn normalize(text: &str) -> String {
    let folded: String = text
        .chars()
        .map(|c| match c {
            '\u{ff01}'..='\u{ff5e}' => char::from_u32(c as u32 - 0xfee0).unwrap_or(c),
            '\u{3000}' => ' ',
            _ => c,
        })
        .collect::<String>()
        .to_lowercase();
    folded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Occurrences of `word` in `text` (ASCII words on word boundaries only).
fn find_word(text: &str, word: &str) -> Vec<(usize, usize)> {
    let ascii = word.is_ascii();
    text.match_indices(word)
        .map(|(i, _)| (i, i + word.len()))
        .filter(|&(s, e)| !ascii || on_word_boundary(text, s, e))
        .collect()
}

fn overlaps(taken: &[(usize, usize)], s: usize, e: usize) -> bool {
    taken.iter().any(|&(a, b)| s < b && e > a)
}

/// Turn a command into an [`Interpretation`]. Never fails; an empty or
/// meaningless text gives an interpretation that is not actionable.
pub fn interpret(text: &str) -> Interpretation {
    let lang = detect_lang(text);
    let t = normalize(text);
    let mut taken: Vec<(usize, usize)> = Vec::new();

    // Regions first: "中国台湾" must not leave "台湾" for a name search.
    let regions = scan_regions(&t);
    for (_, s, e) in &regions {
        taken.push((*s, *e));
    }
    let region = regions.first().map(|(r, _, _)| r.code);

    let mut verb: Option<Verb> = None;
    for (word, v) in VERBS {
        for (s, e) in find_word(&t, word) {
            if !overlaps(&taken, s, e) {
                taken.push((s, e));
                verb = Some(verb.map_or(*v, |cur| cur.min(*v)));
            }
        }
    }

    // Domain words, longest first so "海缆登陆点" beats "海缆".
    let mut hits: Vec<(usize, EarthDomain, Extra)> = Vec::new();
    let mut words: Vec<&(&str, EarthDomain, Extra)> = DOMAIN_WORDS.iter().collect();
    words.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
    for (word, d, extra) in words {
        for (s, e) in find_word(&t, word) {
            if !overlaps(&taken, s, e) {
                taken.push((s, e));
                hits.push((s, *d, *extra));
            }
        }
    }
    let mut constellation: Option<(usize, Constellation)> = None;
    let mut cwords: Vec<&(&str, Constellation)> = CONSTELLATION_WORDS.iter().collect();
    cwords.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
    for (word, c) in cwords {
        for (s, e) in find_word(&t, word) {
            if !overlaps(&taken, s, e) {
                taken.push((s, e));
                if constellation.is_none() {
                    constellation = Some((s, *c));
                }
            }
        }
    }
    let mut alias: Option<(usize, EarthDomain, &str, &str)> = None;
    for (word, d, name) in ALIASES {
        for (s, e) in find_word(&t, word) {
            if !overlaps(&taken, s, e) {
                taken.push((s, e));
                if alias.is_none() {
                    alias = Some((s, *d, *name, *word));
                }
            }
        }
    }
    if let Some((s, _)) = constellation {
        hits.push((s, EarthDomain::Satellites, Extra::None));
    }
    if let Some((s, d, _, _)) = alias {
        hits.push((s, d, Extra::None));
    }
    hits.sort_by_key(|h| h.0);

    // Residual text → name query.
    let mut residual = String::with_capacity(t.len());
    for (i, ch) in t.char_indices() {
        if taken.iter().any(|&(a, b)| i >= a && i < b) {
            residual.push(' ');
        } else {
            residual.push(ch);
        }
    }
    for w in STOP_ZH {
        residual = residual.replace(w, " ");
    }
    let tokens: Vec<String> = residual
        .split(|c: char| c.is_whitespace() || "，。！？、,.!?;；:：\"'“”‘’()（）[]【】".contains(c))
        .map(|tok| tok.trim_matches(|c: char| !c.is_alphanumeric()).to_string())
        .filter(|tok| !tok.is_empty() && !STOP_EN.contains(&tok.as_str()))
        .collect();
    let joined = tokens.join(" ");
    let mut name_query = (joined.chars().count() >= 2
        || joined.chars().any(|c| c.is_ascii_digit()))
    .then_some(joined)
    .filter(|q| !q.is_empty());
    let mut name_label = name_query.clone();
    if let Some((_, _, name, word)) = alias {
        name_query = Some(name.to_string());
        name_label = Some(word.to_string());
    }

    // Per domain, the distinct extras named; one distinct value becomes a
    // filter, two ("超算和智算", "海缆和登陆点") mean both, so no filter.
    let mut domains: Vec<DomainIntent> = Vec::new();
    let mut extras: Vec<Vec<Extra>> = Vec::new();
    for (_, d, extra) in hits {
        let idx = match domains.iter().position(|x| x.domain == d) {
            Some(i) => i,
            None => {
                domains.push(DomainIntent {
                    domain: d,
                    filters: EntityFilters::default(),
                });
                extras.push(Vec::new());
                domains.len() - 1
            }
        };
        if !matches!(extra, Extra::None) && !extras[idx].contains(&extra) {
            extras[idx].push(extra);
        }
    }
    for (di, ex) in domains.iter_mut().zip(&extras) {
        if let [only] = ex.as_slice() {
            let f = &mut di.filters;
            match only {
                Extra::Site(s) => f.site_type = Some(*s),
                Extra::Kind(k) => f.kind = Some(*k),
                Extra::VesselType(v) => f.vessel_type = Some(v.to_string()),
                Extra::None => {}
            }
        }
    }
    if domains.len() > 3 {
        domains.truncate(3);
    }
    for di in &mut domains {
        if di.domain == EarthDomain::Satellites {
            di.filters.constellation = constellation.map(|(_, c)| c);
        }
        if let Some(code) = region {
            di.filters.country = Some(code.to_string());
        }
        if let Some(q) = &name_query {
            di.filters.name_contains = Some(q.clone());
        }
    }
    let probe = domains.is_empty() && name_query.is_some() && verb != Some(Verb::Clear);
    Interpretation {
        lang,
        verb,
        domains,
        region,
        name_query,
        name_label,
        probe,
    }
}

/// Whether a domain is only being switched on (no filters, "打开卫星图层"):
/// then only the count is needed.
fn layer_only(interp: &Interpretation, d: &DomainIntent) -> bool {
    interp.verb == Some(Verb::Show) && !d.is_narrowed()
}

/// The entity queries the plan needs, one per named domain (none for
/// clear/hide). `limit` is the highlight cap.
pub fn queries(interp: &Interpretation, limit: usize) -> Vec<EntityQuery> {
    if !interp.is_actionable() || matches!(interp.verb, Some(Verb::Clear) | Some(Verb::Hide)) {
        return Vec::new();
    }
    interp
        .domains
        .iter()
        .map(|d| {
            let l = if layer_only(interp, d) { 0 } else { limit };
            EntityQuery::new(d.domain)
                .with_filters(d.filters.clone())
                .with_limit(l)
        })
        .collect()
}

/// A probe query of a bare name in `domain` (country filter kept).
pub fn probe_query(interp: &Interpretation, domain: EarthDomain, limit: usize) -> EntityQuery {
    let filters = EntityFilters {
        name_contains: interp.name_query.clone(),
        country: interp.region.map(str::to_string),
        ..Default::default()
    };
    EntityQuery::new(domain)
        .with_filters(filters)
        .with_limit(limit)
}

/// Limits of a plan.
#[derive(Debug, Clone, Copy)]
pub struct PlanLimits {
    pub max_highlight: usize,
    pub panel_items: usize,
}

/// A plan with what the response needs besides the run id.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedPlan {
    pub summary: String,
    pub actions: Vec<EarthAction>,
    pub matched_entities: Vec<MatchedEntity>,
    pub missing_data: Vec<String>,
    pub confidence: f64,
    pub clarification_needed: bool,
}

/// Default highlight colour per domain (`#rrggbb`).
pub fn domain_color(d: EarthDomain) -> &'static str {
    match d {
        EarthDomain::Satellites => "#7dd3fc",
        EarthDomain::ComputeCenters => "#f59e0b",
        EarthDomain::Bgp => "#ef4444",
        EarthDomain::News => "#a78bfa",
        EarthDomain::Vessels => "#34d399",
        EarthDomain::Cables => "#22d3ee",
    }
}

/// The clarification answer.
pub fn clarification(lang: Lang) -> ResolvedPlan {
    let summary = match lang {
        Lang::Zh => "没有理解要在地球上显示什么。请说明对象，例如“高亮所有北斗卫星”或“显示中国大陆的算力中心”。",
        Lang::En => "I could not tell what to show on the Earth view. Name the objects, for example \
                     \"highlight all BeiDou satellites\" or \"show compute centers in mainland China\".",
    };
    ResolvedPlan {
        summary: summary.to_string(),
        actions: Vec::new(),
        matched_entities: Vec::new(),
        missing_data: Vec::new(),
        confidence: 0.0,
        clarification_needed: true,
    }
}

fn layer_name(d: EarthDomain, lang: Lang) -> &'static str {
    match (d, lang) {
        (EarthDomain::Satellites, Lang::Zh) => "卫星",
        (EarthDomain::ComputeCenters, Lang::Zh) => "算力中心",
        (EarthDomain::Bgp, Lang::Zh) => "BGP",
        (EarthDomain::News, Lang::Zh) => "新闻",
        (EarthDomain::Vessels, Lang::Zh) => "船舶",
        (EarthDomain::Cables, Lang::Zh) => "海缆",
        (EarthDomain::Satellites, Lang::En) => "satellites",
        (EarthDomain::ComputeCenters, Lang::En) => "compute centers",
        (EarthDomain::Bgp, Lang::En) => "BGP",
        (EarthDomain::News, Lang::En) => "news",
        (EarthDomain::Vessels, Lang::En) => "vessels",
        (EarthDomain::Cables, Lang::En) => "cables",
    }
}

/// Counting unit (Chinese) for a domain's entities.
fn unit(d: EarthDomain, f: &EntityFilters) -> &'static str {
    match d {
        EarthDomain::Satellites => "颗",
        EarthDomain::ComputeCenters => "个",
        EarthDomain::Bgp => "起",
        EarthDomain::News => "条",
        EarthDomain::Vessels => "艘",
        EarthDomain::Cables if f.kind == Some(EntityKind::LandingPoint) => "个",
        EarthDomain::Cables => "条",
    }
}

/// The noun phrase for what was asked ("中国大陆的算力中心", "BeiDou satellites").
/// `name_label` is how a `name_contains` filter is put to the user (never
/// an internal catalogue spelling); `None` shows the filter as it is.
fn subject(
    d: EarthDomain,
    f: &EntityFilters,
    region: Option<&Region>,
    lang: Lang,
    name_label: Option<&str>,
) -> String {
    let noun = match lang {
        Lang::Zh => match d {
            EarthDomain::Satellites => match f.constellation {
                Some(Constellation::Beidou) => "北斗卫星",
                Some(Constellation::Gps) => "GPS 卫星",
                Some(Constellation::Galileo) => "伽利略卫星",
                Some(Constellation::Glonass) => "格洛纳斯卫星",
                Some(Constellation::Starlink) => "星链卫星",
                Some(Constellation::Iridium) => "铱星",
                Some(Constellation::Oneweb) => "OneWeb 卫星",
                Some(Constellation::Geo) => "地球同步轨道卫星",
                Some(Constellation::Leo) => "低轨卫星",
                Some(Constellation::Meo) => "中轨卫星",
                Some(Constellation::Heo) => "高椭圆轨道卫星",
                None => "卫星",
            },
            EarthDomain::ComputeCenters => match f.site_type {
                Some(SiteType::Supercomputer) => "超算中心",
                Some(SiteType::GpuCluster) => "智算中心（GPU 集群）",
                None => "算力中心",
            },
            EarthDomain::Bgp => "BGP 劫持事件",
            EarthDomain::News => "新闻",
            EarthDomain::Vessels => "船舶",
            EarthDomain::Cables => match f.kind {
                Some(EntityKind::LandingPoint) => "海缆登陆点",
                Some(EntityKind::Cable) => "海缆",
                None => "海缆及登陆点",
            },
        },
        Lang::En => match d {
            EarthDomain::Satellites => match f.constellation {
                Some(Constellation::Beidou) => "BeiDou satellites",
                Some(Constellation::Gps) => "GPS satellites",
                Some(Constellation::Galileo) => "Galileo satellites",
                Some(Constellation::Glonass) => "GLONASS satellites",
                Some(Constellation::Starlink) => "Starlink satellites",
                Some(Constellation::Iridium) => "Iridium satellites",
                Some(Constellation::Oneweb) => "OneWeb satellites",
                Some(Constellation::Geo) => "geosynchronous satellites",
                Some(Constellation::Leo) => "LEO satellites",
                Some(Constellation::Meo) => "MEO satellites",
                Some(Constellation::Heo) => "HEO satellites",
                None => "satellites",
            },
            EarthDomain::ComputeCenters => match f.site_type {
                Some(SiteType::Supercomputer) => "supercomputers",
                Some(SiteType::GpuCluster) => "GPU clusters",
                None => "compute centers",
            },
            EarthDomain::Bgp => "BGP hijack events",
            EarthDomain::News => "news items",
            EarthDomain::Vessels => "vessels",
            EarthDomain::Cables => match f.kind {
                Some(EntityKind::LandingPoint) => "cable landing points",
                Some(EntityKind::Cable) => "submarine cables",
                None => "cables and landing points",
            },
        },
    };
    let name = f
        .name_contains
        .as_deref()
        .map(|n| name_label.unwrap_or(n))
        .filter(|_| d != EarthDomain::Satellites || f.constellation.is_none());
    match lang {
        Lang::Zh => {
            let mut s = String::new();
            if let Some(r) = region {
                s.push_str(r.zh);
                s.push('的');
            }
            if let Some(n) = name {
                s.push_str(&format!("名称包含“{n}”的"));
            }
            s.push_str(noun);
            s
        }
        Lang::En => {
            let mut s = noun.to_string();
            if let Some(n) = name {
                s.push_str(&format!(" named like \"{n}\""));
            }
            if let Some(r) = region {
                s.push_str(" in ");
                s.push_str(r.en);
            }
            s
        }
    }
}

fn panel_item(e: &MatchedEntity) -> ResultPanelItem {
    let subtitle = match e.domain {
        EarthDomain::Satellites => e
            .properties
            .get("norad_id")
            .and_then(|v| v.as_u64())
            .map(|n| format!("NORAD {n}")),
        _ => e.country.clone(),
    };
    ResultPanelItem {
        entity_id: e.entity_id.clone(),
        label: e.name.clone(),
        subtitle,
    }
}

/// True when `r` is empty because no source of domain `d` is configured
/// (the catalogue's note), not because nothing matched.
fn source_missing(d: EarthDomain, r: &EntityQueryResult) -> bool {
    let note = super::entities::no_source_note(d);
    r.missing_data.contains(&note)
}

fn push_unique(notes: &mut Vec<String>, note: String) {
    if !notes.contains(&note) {
        notes.push(note);
    }
}

/// Build the plan for `interp` from the results of [`queries`] (or one
/// probe result), in the same order.
pub fn build_plan(
    interp: &Interpretation,
    results: &[(EntityQuery, EntityQueryResult)],
    limits: PlanLimits,
) -> ResolvedPlan {
    let lang = interp.lang;
    if !interp.is_actionable() {
        return clarification(lang);
    }
    match interp.verb {
        Some(Verb::Clear) => return clear_plan(interp),
        Some(Verb::Hide) => return hide_plan(interp),
        _ => {}
    }
    let region = interp.region();
    if interp.domains.is_empty() && !interp.probe {
        return region_only_plan(interp, region);
    }
    let mut draft = Draft {
        confidence: if interp.verb.is_some() { 0.9 } else { 0.8 },
        ..Draft::default()
    };
    if interp.probe {
        draft.confidence -= 0.2;
        if !results.iter().any(|(_, r)| r.total_matched > 0) {
            return probe_miss(lang, results);
        }
    }
    let entries: Vec<&(EntityQuery, EntityQueryResult)> = if interp.probe {
        results
            .iter()
            .filter(|(_, r)| r.total_matched > 0)
            .take(1)
            .collect()
    } else {
        results.iter().collect()
    };
    for (q, r) in entries {
        draft.add_result(interp, region, q, r, limits);
    }
    finish(
        lang,
        draft.parts,
        draft.actions,
        draft.matched,
        draft.missing,
        draft.confidence,
    )
}

/// "Clear the highlights" (of one layer, or all).
fn clear_plan(interp: &Interpretation) -> ResolvedPlan {
    let lang = interp.lang;
    let domain = interp.domains.first().map(|d| d.domain);
    let summary = match (lang, domain) {
        (Lang::Zh, Some(d)) => format!("已清除{}图层的 AI 高亮。", layer_name(d, lang)),
        (Lang::Zh, None) => "已清除 AI 高亮。".to_string(),
        (Lang::En, Some(d)) => format!(
            "Cleared the AI highlights on the {} layer.",
            layer_name(d, lang)
        ),
        (Lang::En, None) => "Cleared the AI highlights.".to_string(),
    };
    ResolvedPlan {
        summary,
        actions: vec![EarthAction::ClearHighlight { domain }],
        matched_entities: Vec::new(),
        missing_data: Vec::new(),
        confidence: 0.95,
        clarification_needed: false,
    }
}

/// "Hide the layers" of the named domains.
fn hide_plan(interp: &Interpretation) -> ResolvedPlan {
    let lang = interp.lang;
    let mut actions = Vec::new();
    let mut parts = Vec::new();
    for d in &interp.domains {
        actions.push(EarthAction::ShowLayer {
            layer: d.domain,
            enabled: false,
        });
        parts.push(match lang {
            Lang::Zh => format!("已隐藏{}图层", layer_name(d.domain, lang)),
            Lang::En => format!("Hid the {} layer", layer_name(d.domain, lang)),
        });
    }
    finish(lang, parts, actions, Vec::new(), Vec::new(), 0.95)
}

/// No domain named: a focus on a region only ("聚焦中国大陆"), else a
/// clarification.
fn region_only_plan(interp: &Interpretation, region: Option<&Region>) -> ResolvedPlan {
    let lang = interp.lang;
    let (Some(Verb::Focus), Some(r)) = (interp.verb, region) else {
        return clarification(lang);
    };
    let summary = match lang {
        Lang::Zh => format!("已聚焦到{}。", r.zh),
        Lang::En => format!("Focused on {}.", r.en),
    };
    ResolvedPlan {
        summary,
        actions: vec![region_focus(r, lang)],
        matched_entities: Vec::new(),
        missing_data: Vec::new(),
        confidence: 0.9,
        clarification_needed: false,
    }
}

/// A bare word that names nothing: ask instead of guessing, with the
/// probes' notes (but not the unconfigured sources).
fn probe_miss(lang: Lang, results: &[(EntityQuery, EntityQueryResult)]) -> ResolvedPlan {
    let mut c = clarification(lang);
    for (_, r) in results {
        for n in &r.missing_data {
            if !n.starts_with("no data source configured") {
                push_unique(&mut c.missing_data, n.clone());
            }
        }
    }
    c
}

/// A plan being assembled from the query results, in order: its actions,
/// the entities it points at, the notes, the summary's clauses.
#[derive(Default)]
struct Draft {
    actions: Vec<EarthAction>,
    matched: Vec<MatchedEntity>,
    missing: Vec<String>,
    parts: Vec<String>,
    confidence: f64,
    /// The one camera move of a focus command is made.
    focus_done: bool,
}

impl Draft {
    /// One query's result: show its layer, then (unless the command only
    /// shows the layer, or nothing matched) filter or highlight the
    /// matches, list them in a panel and, for a focus command, move the
    /// camera.
    fn add_result(
        &mut self,
        interp: &Interpretation,
        region: Option<&Region>,
        q: &EntityQuery,
        r: &EntityQueryResult,
        limits: PlanLimits,
    ) {
        let lang = interp.lang;
        let d = q.domain;
        let f = &q.filters;
        for n in &r.missing_data {
            push_unique(&mut self.missing, n.clone());
        }
        // A well-known name (`ISS`) found once is shown as the entity's
        // display name, otherwise as the user wrote it.
        let alias_hit = match (
            &interp.name_label,
            &interp.name_query,
            r.entities.as_slice(),
        ) {
            (Some(label), Some(query), [only]) if label != query => Some(only.name.as_str()),
            _ => None,
        };
        let label = alias_hit.or(interp.name_label.as_deref());
        let subj = subject(d, f, region, lang, label);
        let u = unit(d, f);
        self.actions.push(EarthAction::ShowLayer {
            layer: d,
            enabled: true,
        });
        let only_layer = interp.verb == Some(Verb::Show) && !narrows(f);
        if only_layer {
            self.parts.push(match lang {
                Lang::Zh => format!(
                    "已打开{}图层（共 {} {u}）",
                    layer_name(d, lang),
                    r.total_matched
                ),
                Lang::En => format!(
                    "Showing the {} layer ({} in total)",
                    layer_name(d, lang),
                    r.total_matched
                ),
            });
            return;
        }
        if r.total_matched == 0 && source_missing(d, r) {
            // Nothing to search, which is not the same as nothing found.
            self.confidence = self.confidence.min(0.3);
            self.parts.push(match lang {
                Lang::Zh => format!("未配置{}数据源，无法查询{subj}", layer_name(d, lang)),
                Lang::En => format!(
                    "No {} data source is configured, so {subj} cannot be looked up",
                    layer_name(d, lang)
                ),
            });
            return;
        }
        if r.total_matched == 0 {
            self.confidence = self.confidence.min(0.6);
            self.parts.push(match lang {
                Lang::Zh => format!("未找到{subj}"),
                Lang::En => format!("No {subj} were found"),
            });
            return;
        }
        let shown: Vec<&MatchedEntity> = r.entities.iter().take(limits.max_highlight).collect();
        let total = r.total_matched;
        let title = match lang {
            Lang::Zh => format!("{subj}（{total}）"),
            Lang::En => format!("{} ({total})", capitalize(&subj)),
        };
        if interp.verb == Some(Verb::Filter) {
            self.add_filter(lang, q, &subj, u, total, shown.len());
        } else {
            self.add_highlight(lang, d, &subj, u, &shown, total, limits);
        }
        self.matched.extend(shown.iter().map(|e| (*e).clone()));
        self.actions.push(EarthAction::OpenResultPanel {
            title,
            items: r
                .entities
                .iter()
                .take(limits.panel_items)
                .map(panel_item)
                .collect(),
        });
        if interp.verb == Some(Verb::Focus) && !self.focus_done {
            self.add_focus(interp, region, d, &shown, total);
        }
        if d == EarthDomain::News {
            self.confidence = self.confidence.min(0.7);
        }
    }

    /// Filter the layer to the query's matches; `listed` of the `total`
    /// are in `matched_entities`, and the summary says so when that is
    /// fewer.
    fn add_filter(
        &mut self,
        lang: Lang,
        q: &EntityQuery,
        subj: &str,
        u: &str,
        total: usize,
        listed: usize,
    ) {
        self.actions.push(EarthAction::FilterEntities {
            domain: q.domain,
            filters: serde_json::to_value(&q.filters)
                .ok()
                .and_then(|v| v.as_object().cloned())
                .unwrap_or_default(),
            reason: Some(match lang {
                Lang::Zh => format!("用户要求筛选{subj}"),
                Lang::En => format!("The operator asked to filter {subj}"),
            }),
        });
        self.parts.push(match (lang, total > listed) {
            (Lang::Zh, false) => format!("已筛选出 {total} {u}{subj}"),
            (Lang::Zh, true) => format!("已筛选出 {total} {u}{subj}，列出前 {listed} {u}"),
            (Lang::En, false) => format!("Filtered to {total} {subj}"),
            (Lang::En, true) => format!("Filtered to {total} {subj}, the first {listed} listed"),
        });
    }

    /// Highlight the `shown` matches (at most `limits.max_highlight` of
    /// `total`), saying so when some are left out.
    #[allow(clippy::too_many_arguments)]
    fn add_highlight(
        &mut self,
        lang: Lang,
        d: EarthDomain,
        subj: &str,
        u: &str,
        shown: &[&MatchedEntity],
        total: usize,
        limits: PlanLimits,
    ) {
        let n = shown.len();
        self.actions.push(EarthAction::HighlightEntities {
            domain: d,
            entity_ids: shown.iter().map(|e| e.entity_id.clone()).collect(),
            style: Some(HighlightStyle {
                color: domain_color(d).to_string(),
                mode: Some(HighlightMode::Glow),
            }),
            reason: Some(match lang {
                Lang::Zh => format!("用户要求高亮{subj}"),
                Lang::En => format!("The operator asked to highlight {subj}"),
            }),
        });
        self.parts.push(match (lang, total > n) {
            (Lang::Zh, false) => format!("已找到并高亮 {n} {u}{subj}"),
            (Lang::Zh, true) => format!(
                "已找到 {total} {u}{subj}，高亮前 {n} {u}（单次最多 {}）",
                limits.max_highlight
            ),
            (Lang::En, false) => format!("Found and highlighted {n} {subj}"),
            (Lang::En, true) => format!(
                "Found {total} {subj} and highlighted the first {n} (at most {} per highlight)",
                limits.max_highlight
            ),
        });
        if total > n {
            push_unique(
                &mut self.missing,
                format!(
                    "highlight limited to {n} of {total} matched {} entities",
                    d.as_str()
                ),
            );
        }
    }

    /// The camera move of a focus command: to the named region, else to the
    /// one entity meant; otherwise a note why the camera stays.
    fn add_focus(
        &mut self,
        interp: &Interpretation,
        region: Option<&Region>,
        d: EarthDomain,
        shown: &[&MatchedEntity],
        total: usize,
    ) {
        let lang = interp.lang;
        if let Some(rg) = region {
            self.actions.push(region_focus(rg, lang));
            self.parts.push(match lang {
                Lang::Zh => format!("并聚焦到{}", rg.zh),
                Lang::En => format!("and focused on {}", rg.en),
            });
            self.focus_done = true;
            return;
        }
        let Some(e) = pick_focus_entity(shown, interp.name_query.as_deref()) else {
            push_unique(
                &mut self.missing,
                format!(
                    "focus needs one entity or a region; {total} {} entities matched, so they are \
                     highlighted without moving the camera",
                    d.as_str()
                ),
            );
            return;
        };
        let (Some(lat), Some(lon)) = (e.lat, e.lon) else {
            push_unique(
                &mut self.missing,
                format!("{} has no coordinates to focus on", e.entity_id),
            );
            return;
        };
        self.actions.push(EarthAction::FocusView {
            lat: Some(lat),
            lon: Some(lon),
            altitude_km: Some(if d == EarthDomain::Satellites {
                20_000.0
            } else {
                1_500.0
            }),
            region: None,
            entity_id: Some(e.entity_id.clone()),
            reason: Some(match lang {
                Lang::Zh => format!("聚焦到{}", e.name),
                Lang::En => format!("Focus on {}", e.name),
            }),
        });
        self.parts.push(match lang {
            Lang::Zh => format!("并聚焦到{}", e.name),
            Lang::En => format!("and focused on {}", e.name),
        });
        self.focus_done = true;
    }
}

/// With one match, or a name query equal to one name, that entity.
fn pick_focus_entity<'a>(
    shown: &[&'a MatchedEntity],
    name: Option<&str>,
) -> Option<&'a MatchedEntity> {
    if shown.len() == 1 {
        return shown.first().copied();
    }
    let n = name?.to_lowercase();
    shown.iter().copied().find(|e| e.name.to_lowercase() == n)
}

fn region_focus(r: &Region, lang: Lang) -> EarthAction {
    EarthAction::FocusView {
        lat: Some(r.lat),
        lon: Some(r.lon),
        altitude_km: Some(r.altitude_km),
        region: Some(r.code.to_string()),
        entity_id: None,
        reason: Some(match lang {
            Lang::Zh => format!("聚焦到{}", r.zh),
            Lang::En => format!("Focus on {}", r.en),
        }),
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

fn finish(
    lang: Lang,
    parts: Vec<String>,
    actions: Vec<EarthAction>,
    matched: Vec<MatchedEntity>,
    missing: Vec<String>,
    confidence: f64,
) -> ResolvedPlan {
    let summary = match lang {
        Lang::Zh => {
            // "…，并聚焦到…" joins with a comma; separate domains with "；".
            let mut s = String::new();
            for p in &parts {
                if !s.is_empty() {
                    s.push_str(if p.starts_with('并') { "，" } else { "；" });
                }
                s.push_str(p);
            }
            s.push('。');
            s
        }
        Lang::En => {
            let mut s = String::new();
            for p in &parts {
                if !s.is_empty() {
                    s.push_str(if p.starts_with("and ") { ", " } else { "; " });
                }
                s.push_str(p);
            }
            s.push('.');
            s
        }
    };
    ResolvedPlan {
        summary,
        actions,
        matched_entities: matched,
        missing_data: missing,
        confidence: confidence.clamp(0.0, 1.0),
        clarification_needed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dom(i: &Interpretation) -> Vec<EarthDomain> {
        i.domains.iter().map(|d| d.domain).collect()
    }

    #[test]
    fn beidou_highlight_in_chinese() {
        let i = interpret("高亮所有北斗卫星");
        assert_eq!(i.lang, Lang::Zh);
        assert_eq!(i.verb, Some(Verb::Highlight));
        assert_eq!(dom(&i), vec![EarthDomain::Satellites]);
        assert_eq!(
            i.domains[0].filters.constellation,
            Some(Constellation::Beidou)
        );
        assert_eq!(i.name_query, None);
    }

    #[test]
    fn mainland_china_compute_centers_without_a_verb() {
        let i = interpret("中国大陆的算力中心");
        assert_eq!(i.verb, None);
        assert_eq!(dom(&i), vec![EarthDomain::ComputeCenters]);
        assert_eq!(i.domains[0].filters.country.as_deref(), Some("CN"));
        assert!(i.is_actionable());
    }

    #[test]
    fn english_commands_map_to_the_same_filters() {
        let i = interpret("Highlight all Starlink satellites");
        assert_eq!((i.lang, i.verb), (Lang::En, Some(Verb::Highlight)));
        assert_eq!(
            i.domains[0].filters.constellation,
            Some(Constellation::Starlink)
        );
        let i = interpret("show supercomputers in Japan");
        assert_eq!(
            i.domains[0].filters.site_type,
            Some(SiteType::Supercomputer)
        );
        assert_eq!(i.domains[0].filters.country.as_deref(), Some("JP"));
        assert_eq!(i.name_query, None);
    }

    #[test]
    fn priority_of_action_words() {
        assert_eq!(interpret("取消高亮").verb, Some(Verb::Clear));
        assert_eq!(interpret("只显示台湾的海缆").verb, Some(Verb::Filter));
        assert_eq!(interpret("显示并聚焦日本的超算").verb, Some(Verb::Focus));
        assert_eq!(interpret("隐藏卫星图层").verb, Some(Verb::Hide));
    }

    #[test]
    fn a_bare_name_is_probed_and_nonsense_is_not_actionable() {
        let i = interpret("聚焦 国际空间站");
        assert_eq!(dom(&i), vec![EarthDomain::Satellites]);
        assert_eq!(
            i.domains[0].filters.name_contains.as_deref(),
            Some("iss (zarya)")
        );
        let i = interpret("focus on Frontier");
        assert!(i.probe);
        assert_eq!(i.name_query.as_deref(), Some("frontier"));
        assert!(!interpret("").is_actionable());
        assert!(!interpret("高亮").is_actionable());
        assert!(!interpret("？？？").is_actionable());
    }

    #[test]
    fn cables_and_landing_points_are_told_apart() {
        let i = interpret("显示中国大陆的海缆登陆点");
        assert_eq!(i.domains[0].filters.kind, Some(EntityKind::LandingPoint));
        let i = interpret("高亮日本的海缆");
        assert_eq!(i.domains[0].filters.kind, Some(EntityKind::Cable));
    }
}
