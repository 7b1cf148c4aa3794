export default { path: "#/events", title: "Events", render() {} };
