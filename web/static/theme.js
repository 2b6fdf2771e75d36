// VoxMux Studio: the saved (or the system's) theme, set before the page is first painted.
"use strict";
try {
  document.documentElement.dataset.theme = localStorage.getItem("voxmux.theme") ||
    (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
} catch (e) { /* storage disabled: the light theme */ }
