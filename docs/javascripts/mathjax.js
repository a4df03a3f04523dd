// MathJax settings for pymdownx.arithmatex (generic mode) and for the notebooks' markdown cells,
// and re-typesetting on instant navigation. MathJax itself ships with the site
// (javascripts/vendor/mathjax, SVG output: no web fonts, so it also renders from file://).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    // Only the formulas arithmatex marked, and the notebooks' rendered markdown.
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown",
  },
};

if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      // clearCache exists for the CHTML output only; the SVG output has nothing to clear.
      if (MathJax.startup.output && typeof MathJax.startup.output.clearCache === "function") {
        MathJax.startup.output.clearCache();
      }
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
