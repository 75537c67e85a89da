// How a message's Markdown is shaped, read in one linear pass before marked
// reads it: how deeply marked would nest it, and how many lines of text it has
// (see renderMessage in markdown.ts, which shows it as plain text past bounds).
const SPACE = 0x20;
const TAB = 0x09;
const NEWLINE = 0x0a;

function isBlank(code: number): boolean {
  return code === SPACE || code === TAB || code === NEWLINE || code === 0x0d || Number.isNaN(code);
}

function isDigit(code: number): boolean {
  return code >= 0x30 && code <= 0x39;
}

/** An upper bound of how deeply marked would nest the message: see markdownShape. */
export function markdownDepth(text: string): number {
  return markdownShape(text).depth;
}

/**
 * In one pass over the message: `lines`, how many of its lines outside fenced
 * code at the top level hold text (more than container markers); `depth`, an
 * upper bound of how deeply marked would nest it. For each line (outside
 * fenced code at the top level): the block quote markers and list markers it
 * starts with, plus one level for every two columns of indentation among them
 * (a nested list needs at least two), the space after each marker not
 * counted. For each paragraph: the most emphasis and strikethrough delimiters
 * (`*`, `_`, `~`) and brackets open at once, a run that can close taken as
 * closing.
 */
export function markdownShape(text: string): { depth: number; lines: number } {
  let deepest = 0;
  let lines = 0;
  let fence: { char: number; length: number } | undefined;
  let inlineOpen = 0;
  let start = 0;
  while (start <= text.length) {
    let end = text.indexOf('\n', start);
    if (end === -1) end = text.length;
    const line = fence === undefined ? lineStart(text, start, end) : undefined;
    if (line === undefined) {
      if (fence !== undefined && closesFence(text, start, end, fence)) fence = undefined;
    } else if (line.fence !== undefined) {
      fence = line.fence;
      inlineOpen = 0;
    } else if (line.blank) {
      deepest = Math.max(deepest, line.depth); // (a line of markers alone nests as deep)
      inlineOpen = 0; // emphasis and links end with their paragraph
    } else {
      lines += 1;
      deepest = Math.max(deepest, line.depth);
      for (let i = line.textStart; i < end; i += 1) {
        const code = text.charCodeAt(i);
        if (code === 0x5c) {
          i += 1; // a backslash escapes what follows
        } else if (code === 0x5b) {
          inlineOpen += 1;
          deepest = Math.max(deepest, inlineOpen);
        } else if (code === 0x5d) {
          inlineOpen = Math.max(0, inlineOpen - 1);
        } else if (code === 0x2a || code === 0x5f || code === 0x7e) {
          let runEnd = i + 1;
          while (runEnd < end && text.charCodeAt(runEnd) === code) runEnd += 1;
          const run = runEnd - i;
          const canOpen = !isBlank(text.charCodeAt(runEnd));
          const canClose = i > line.textStart && !isBlank(text.charCodeAt(i - 1));
          if (canClose && (inlineOpen > 0 || !canOpen)) {
            inlineOpen = Math.max(0, inlineOpen - run);
          } else if (canOpen && !(canClose && code === 0x5f)) {
            // (an underscore inside a word neither opens nor closes)
            inlineOpen += run;
            deepest = Math.max(deepest, inlineOpen);
          }
          i = runEnd - 1;
        }
      }
    }
    start = end + 1;
  }
  return { depth: deepest, lines };
}

/** How a line begins: its container depth, where its text starts, whether it opens a fence or is blank. */
function lineStart(
  text: string,
  start: number,
  end: number,
): {
  depth: number;
  textStart: number;
  blank: boolean;
  fence?: { char: number; length: number };
} {
  let markers = 0;
  let columns = 0;
  let i = start;
  while (i < end) {
    const code = text.charCodeAt(i);
    if (code === SPACE) {
      columns += 1;
      i += 1;
    } else if (code === TAB) {
      columns += 4;
      i += 1;
    } else if (code === 0x3e) {
      i = afterMarker(text, i + 1); // >
      markers += 1;
    } else if (
      (code === 0x2d || code === 0x2a || code === 0x2b) &&
      isBlank(text.charCodeAt(i + 1))
    ) {
      i = afterMarker(text, i + 1); // - * +
      markers += 1;
    } else if (isDigit(code)) {
      let digits = i;
      while (digits < end && digits - i < 9 && isDigit(text.charCodeAt(digits))) digits += 1;
      const after = text.charCodeAt(digits);
      if ((after !== 0x2e && after !== 0x29) || !isBlank(text.charCodeAt(digits + 1))) break;
      i = afterMarker(text, digits + 1); // 1. or 1)
      markers += 1;
    } else {
      break;
    }
  }
  const depth = markers + Math.floor(columns / 2);
  const blank = i >= end || (i === end - 1 && text.charCodeAt(i) === 0x0d);
  // A fence at the top level (no marker, at most three spaces before it).
  let fence: { char: number; length: number } | undefined;
  const first = text.charCodeAt(i);
  if (markers === 0 && i - start <= 3 && columns <= 3 && (first === 0x60 || first === 0x7e)) {
    let run = i;
    while (run < end && text.charCodeAt(run) === first) run += 1;
    // (a backtick fence's info string holds no backtick)
    let info = run;
    while (first === 0x60 && info < end && text.charCodeAt(info) !== 0x60) info += 1;
    if (run - i >= 3 && (first === 0x7e || info === end)) fence = { char: first, length: run - i };
  }
  return { depth, textStart: i, blank, fence };
}

/** Past the one space or tab a container marker takes (it is not indentation). */
function afterMarker(text: string, i: number): number {
  const code = text.charCodeAt(i);
  return code === SPACE || code === TAB ? i + 1 : i;
}

/** Whether the line closes the fence: at most three spaces, a run as long or longer, then only blanks. */
function closesFence(
  text: string,
  start: number,
  end: number,
  fence: { char: number; length: number },
): boolean {
  let i = start;
  while (i < end && i - start < 4 && text.charCodeAt(i) === SPACE) i += 1;
  if (i - start > 3) return false;
  let run = i;
  while (run < end && text.charCodeAt(run) === fence.char) run += 1;
  if (run - i < fence.length) return false;
  for (let rest = run; rest < end; rest += 1) if (!isBlank(text.charCodeAt(rest))) return false;
  return true;
}
