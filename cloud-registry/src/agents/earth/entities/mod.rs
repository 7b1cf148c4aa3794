//! Entity query over the six Earth domains (seed 000 "Earth Entity Query").
