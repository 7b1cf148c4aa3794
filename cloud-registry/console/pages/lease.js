export default { path: "#/leases/{id}", title: "Lease", nav: false, render() {} };
