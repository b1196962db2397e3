// The programs' console, written as Deno's writes: a program's output is the same text
// on wasm-js as on deno, where TypeScript used to run and JavaScript may.
//
// SpiderMonkey's own console prints values in its own notation (`[1, 2]`, a Date as
// `new Date(0)`, an Error as its constructor call, no format specifiers), so every
// method is replaced here, and only ever writes lines of text through the engine's.
// What a value looks like follows Deno's `console.log` (tests compare the two on the
// same values): `[ 1, 2 ]`, `{ a: 1, "b-c": 2 }`, `Map(1) { "k" => 1 }`, nested
// strings quoted, objects past depth 4 as `[Object]`, cycles as `<ref *1>`, a value
// longer than a line broken over lines, and arrays of more than six short items laid
// out in columns. What a script cannot see is shown as such: a promise's state
// (`Promise { <unknown> }`), a proxy (shown as what it answers), an error's frames (only
// the program's own, as `<program>:line:column`).
//
// Everything here runs in the program's realm, after the program may have replaced
// built-ins. The methods it calls are mostly captured when this module loads, at build
// time; what it still looks up when it runs (array iteration, a Map's get and set, a
// regular expression's replace) a program can change only for its own output, which it
// writes anyway.

const ObjectProto = Object.prototype;
const { getOwnPropertyNames, getOwnPropertySymbols, getOwnPropertyDescriptor, getPrototypeOf } =
  Object;
const { isArray } = Array;
const uncurry = (method) => Function.prototype.call.bind(method);
const hasOwn = Object.hasOwn;
const objectToString = uncurry(ObjectProto.toString);
const functionToString = uncurry(Function.prototype.toString);
const dateToISOString = uncurry(Date.prototype.toISOString);
const dateGetTime = uncurry(Date.prototype.getTime);
const regexpToString = uncurry(RegExp.prototype.toString);
const symbolToString = uncurry(Symbol.prototype.toString);
const symbolDescription = uncurry(getOwnPropertyDescriptor(Symbol.prototype, "description").get);
const mapEntries = uncurry(Map.prototype.entries);
const mapSize = uncurry(getOwnPropertyDescriptor(Map.prototype, "size").get);
const regexpSource = uncurry(getOwnPropertyDescriptor(RegExp.prototype, "source").get);
const weakMapHas = uncurry(WeakMap.prototype.has);
const weakSetHas = uncurry(WeakSet.prototype.has);
const weakRefDeref = uncurry(WeakRef.prototype.deref);
const isView = ArrayBuffer.isView;
const PromiseCtor = Promise;
const ErrorCtor = Error;
/** The stack SpiderMonkey captured for an error, read through the engine's own getter
 * (guest.js replaces the property with one giving Deno's text). */
export const engineStack = uncurry(getOwnPropertyDescriptor(Error.prototype, "stack").get);
const DataViewCtor = DataView;
const Uint8ArrayCtor = Uint8Array;
const setValues = uncurry(Set.prototype.values);
const setSize = uncurry(getOwnPropertyDescriptor(Set.prototype, "size").get);
const typedArrayProto = getPrototypeOf(Uint8Array.prototype);
const typedArrayTag = uncurry(getOwnPropertyDescriptor(typedArrayProto, Symbol.toStringTag).get);
const typedArrayLength = uncurry(getOwnPropertyDescriptor(typedArrayProto, "length").get);
const byteLength = uncurry(getOwnPropertyDescriptor(ArrayBuffer.prototype, "byteLength").get);
const numberValueOf = uncurry(Number.prototype.valueOf);
const stringValueOf = uncurry(String.prototype.valueOf);
const booleanValueOf = uncurry(Boolean.prototype.valueOf);
const bigintValueOf = uncurry(BigInt.prototype.valueOf);
const symbolValueOf = uncurry(Symbol.prototype.valueOf);
const stringRepeat = uncurry(String.prototype.repeat);
const stringReplace = uncurry(String.prototype.replace);
const stringSplit = uncurry(String.prototype.split);
const stringIncludes = uncurry(String.prototype.includes);
const stringPadStart = uncurry(String.prototype.padStart);
const stringPadEnd = uncurry(String.prototype.padEnd);
const stringSlice = uncurry(String.prototype.slice);
const stringIndexOf = uncurry(String.prototype.indexOf);
const stringCharCodeAt = uncurry(String.prototype.charCodeAt);
const stringStartsWith = uncurry(String.prototype.startsWith);
const stringEndsWith = uncurry(String.prototype.endsWith);
const regexpTest = uncurry(RegExp.prototype.test);
const regexpExec = uncurry(RegExp.prototype.exec);
const arrayJoin = uncurry(Array.prototype.join);
const arrayPush = uncurry(Array.prototype.push);
const arrayIncludes = uncurry(Array.prototype.includes);
const arrayIndexOf = uncurry(Array.prototype.indexOf);
const mathMax = Math.max;
const mathMin = Math.min;
const mathSqrt = Math.sqrt;
const mathRound = Math.round;
const mathFloor = Math.floor;
const toNumber = Number;
const { isNaN } = Number;
const toText = String;
const parseIntText = parseInt;
const parseFloatText = parseFloat;
const stringify = JSON.stringify;
const mapIteratorNext = uncurry(getPrototypeOf(new Map().entries()).next);
const setIteratorNext = uncurry(getPrototypeOf(new Set().values()).next);
const URLCtor = URL;
const URL_FIELDS = ["href", "origin", "protocol", "username", "password", "host", "hostname"];
const URL_LAST_FIELDS = ["port", "pathname", "hash", "search"];
const MapCtor = Map;
const searchParamsEntries = uncurry(URLSearchParams.prototype.entries);
const headersEntries = uncurry(Headers.prototype.entries);

// Deno's defaults: nesting shown to depth 4, lines of up to 80 columns, at most 100
// items of a collection, the three innermost levels of a value on one line if they fit.
const DEPTH = 4;
const LINE = 80;
const ITEMS = 100;
const COMPACT = 3;
const PLAIN_KEY = /^[a-zA-Z_][a-zA-Z_0-9]*$/;
const INDEX = /^(0|[1-9][0-9]*)$/;
const ESCAPED = /[\x00-\x1f\x7f-\x9f\\]/g;
// How SpiderMonkey names code run by guest.js's indirect eval in a stack frame. A frame
// reached through a promise is marked with why: `async*` where a function awaited
// (V8 lists it too, unmarked), `Promise.then*` and the like where a reaction was set
// up (V8 lists none of those).
const PROGRAM_FRAME = /^(?:([\w.]+)\*)?(.*?)@.*> eval:(\d+):(\d+)$/;

// How a program's frames are numbered: the line its wrapper adds before it (guest.js
// sets it for each run).
let lineOffset = 0;
// [line, column, width] where `return (` went in front of the final expression on a
// line of the program's own (executors/js_syntax.py `column_shift`), or null.
let columnShift = null;
export function setLineOffset(offset, shift = null) {
  lineOffset = offset;
  columnShift = shift;
}

// A frame's column in the program's own text: moved back past `return (`.
function programColumn(line, column) {
  const shift = columnShift;
  if (shift === null || line !== shift[0] || column < shift[1] + shift[2]) return column;
  return column - shift[2];
}

function escapeChar(char) {
  const code = stringCharCodeAt(char, 0);
  switch (char) {
    case "\n":
      return "\\n";
    case "\t":
      return "\\t";
    case "\r":
      return "\\r";
    case "\b":
      return "\\b";
    case "\f":
      return "\\f";
    case "\v":
      return "\\v";
    case "\\":
      return "\\\\";
    default:
      return `\\x${stringPadStart(code.toString(16), 2, "0")}`;
  }
}

// A string as Deno quotes it: in the first of ", ' and ` it does not hold.
function quote(text) {
  const escaped = stringReplace(text, ESCAPED, escapeChar);
  for (const mark of ['"', "'", "`"]) {
    if (!stringIncludes(text, mark)) return `${mark}${escaped}${mark}`;
  }
  return `"${stringReplace(escaped, /"/g, '\\"')}"`;
}

// A symbol as a value: its description quoted unless it reads as a name, as Deno's
// (`Symbol(a)`, `Symbol("a b")`); as a key it is never quoted.
function formatSymbol(symbol) {
  const description = symbolDescription(symbol);
  if (description === undefined || regexpTest(PLAIN_KEY, description)) {
    return symbolToString(symbol);
  }
  return `Symbol(${quote(description)})`;
}

function formatKey(key) {
  if (typeof key === "symbol") return symbolToString(key);
  return regexpTest(PLAIN_KEY, key) ? key : quote(key);
}

function formatNumber(value) {
  return value === 0 && 1 / value < 0 ? "-0" : toText(value);
}

function formatPrimitive(value, nested) {
  switch (typeof value) {
    case "string":
      return nested ? quote(value) : value;
    case "number":
      return formatNumber(value);
    case "bigint":
      return `${value}n`;
    case "symbol":
      return formatSymbol(value);
    default:
      return toText(value);
  }
}

// The name of the class an object was made by, as its prototype chain says.
function className(value) {
  let proto = value;
  while (proto !== null) {
    const descriptor = getOwnPropertyDescriptor(proto, "constructor");
    if (descriptor !== undefined && typeof descriptor.value === "function") {
      const name = descriptor.value.name;
      if (typeof name === "string" && name !== "") return name;
    }
    proto = getPrototypeOf(proto);
  }
  return null;
}

// An error's own fields shown as Deno shows them, enumerable or not.
const ERROR_FIELDS = ["cause", "errors"];

function hasErrorFields(error) {
  for (const field of ERROR_FIELDS) {
    if (hasOwn(error, field)) return true;
  }
  return false;
}

// Whether `name` is that of a class the error was made by, below Error itself. Walked
// anew each time rather than kept in an array, and reading names as data, never
// through a getter: guest.js reports an execution's error with it, which no code of
// the program's (a static `name` getter, accessors on Array.prototype) may reach.
function madeBy(error, name) {
  for (let proto = getPrototypeOf(error); proto !== null; proto = getPrototypeOf(proto)) {
    const made = getOwnPropertyDescriptor(proto, "constructor")?.value;
    if (typeof made !== "function" || made === ErrorCtor) return false;
    if (getOwnPropertyDescriptor(made, "name")?.value === name) return true;
  }
  return false;
}

function functionKind(value) {
  const source = functionToString(value);
  if (stringStartsWith(source, "class")) return "class";
  const tag = objectToString(value);
  if (tag === "[object AsyncFunction]") return "AsyncFunction";
  if (tag === "[object GeneratorFunction]") return "GeneratorFunction";
  if (tag === "[object AsyncGeneratorFunction]") return "AsyncGeneratorFunction";
  return "Function";
}

function formatFunction(value) {
  const kind = functionKind(value);
  const name = typeof value.name === "string" ? value.name : "";
  if (kind === "class") {
    const parent = getPrototypeOf(value);
    const extended = parent !== Function.prototype && parent !== null && parent.name;
    return `[class ${name || "(anonymous)"}${extended ? ` extends ${parent.name}` : ""}]`;
  }
  return name ? `[${kind}: ${name}]` : `[${kind} (anonymous)]`;
}

// An error as Deno shows one: its name and message, then its frames in the program.
// One with no frames is bracketed, `[Error: message]`, when it is shown as a value.
function formatError(error, context, asValue = false) {
  const name = toText(error.name ?? "Error");
  const made = className(error);
  let text = ownStack(error);
  if (text === null) {
    const message = toText(error.message ?? "");
    text = message === "" ? name : `${name}: ${message}`;
    eachErrorFrame(error, (frame) => {
      text += `\n${frame}`;
    });
  }
  // Deno names the class in place of an "…Error" name the error inherits (not one set
  // on it), or beside it when the class's name does not hold it: `NotFound [Error]`
  // but `NotFoundError` (not for a DOMException, which shows its name alone); only
  // where the text begins with that name, as a stack a program wrote may not.
  const inherited = !hasOwn(error, "name") && made !== "DOMException";
  if (inherited && made && made !== name && stringEndsWith(name, "Error")) {
    const rest = stringSlice(text, name.length);
    if (stringStartsWith(text, name) && (rest === "" || rest[0] === ":" || rest[0] === "\n")) {
      text = `${stringIncludes(made, name) ? made : `${made} [${name}]`}${rest}`;
    }
  }
  if (asValue && !stringIncludes(text, "\n    at ") && made !== "DOMException") {
    text = `[${text}]`;
  }
  if (context.indentation > 0) {
    text = stringReplace(text, /\n/g, `\n${stringRepeat(" ", context.indentation)}`);
  }
  return text;
}

// The stack a program gave an error (`error.stack = ...`), which Deno shows in place of
// the one captured; null if it gave none, or not text.
function ownStack(error) {
  const descriptor = getOwnPropertyDescriptor(error, "stack");
  if (descriptor === undefined || !hasOwn(descriptor, "value")) return null;
  return typeof descriptor.value === "string" ? descriptor.value : null;
}

/** Calls `visit(frame)` for each of the program's own frames where `error` was made, as
 * Deno writes them: `    at name (<program>:line:column)`, or `    at <program>:line:column`
 * for the program's body, at the program's own lines, from the stack SpiderMonkey
 * captured (not one a program set) and below the error's own constructors (which
 * SpiderMonkey lists and V8 does not). No array is made of them: guest.js builds the
 * execution's report with it, which a program's accessors on Array.prototype must not
 * reach. */
export function eachErrorFrame(error, visit) {
  let stack = "";
  try {
    stack = engineStack(error);
  } catch {
    return; // not an error: nothing was captured
  }
  if (typeof stack !== "string") return;
  const lines = stringSplit(stack, "\n");
  let below = false;
  for (let i = 0; i < lines.length; i++) {
    const frame = regexpExec(PROGRAM_FRAME, lines[i]);
    if (frame === null || (frame[1] !== undefined && frame[1] !== "async")) continue;
    const name = frame[2];
    if (!below && name !== "" && madeBy(error, name)) continue;
    below = true;
    const line = mathMax(1, toNumber(frame[3]) - lineOffset);
    const place = `<program>:${line}:${programColumn(line, toNumber(frame[4]))}`;
    visit(name ? `    at ${name} (${place})` : `    at ${place}`);
  }
}

/** `error.stack` as Deno's reads: `Name: message` and the program's frames, as
 * `eachErrorFrame` gives them; never the guest's files or the host's paths. */
export function denoStack(error) {
  const name = error.name === undefined ? "Error" : toText(error.name);
  const message = error.message === undefined ? "" : toText(error.message);
  let text = name === "" ? message : message === "" ? name : `${name}: ${message}`;
  eachErrorFrame(error, (frame) => {
    text += `\n${frame}`;
  });
  return text;
}

function emptyItems(count) {
  return `<${count} empty item${count === 1 ? "" : "s"}>`;
}

function moreItems(count) {
  return `... ${count} more item${count === 1 ? "" : "s"}`;
}

// An array's own names list its indices first, ascending, then "length", then the
// rest: its entries (a run of holes as one, at most ITEMS of them) are read from the
// front and its other keys from the back, so a long or sparse array costs what is shown.
function arrayParts(value, length, context, depth) {
  const names = getOwnPropertyNames(value);
  let last = names.length;
  const keys = [];
  while (last > 0 && !isIndex(names[last - 1])) {
    const key = names[--last];
    if (key !== "length" && getOwnPropertyDescriptor(value, key).enumerable) {
      keys.unshift(key);
    }
  }
  for (const key of getOwnPropertySymbols(value)) {
    if (getOwnPropertyDescriptor(value, key).enumerable) arrayPush(keys, key);
  }
  const output = [];
  let next = 0;
  for (let i = 0; i < last && output.length < ITEMS; i++) {
    const index = toNumber(names[i]);
    if (index >= length) break;
    if (index > next) {
      arrayPush(output, emptyItems(index - next));
      if (output.length >= ITEMS) break;
    }
    arrayPush(output, formatProperty(value, names[i], context, depth, true));
    next = index + 1;
  }
  if (output.length < ITEMS && next < length && !(last > 0 && toNumber(names[last - 1]) >= next)) {
    arrayPush(output, emptyItems(length - next));
    next = length;
  }
  if (next < length) arrayPush(output, moreItems(length - next));
  return { output, keys };
}

function isIndex(name) {
  return regexpTest(INDEX, name) && toNumber(name) < 4294967295;
}

function ownKeys(value) {
  const keys = [];
  for (const key of getOwnPropertyNames(value)) {
    if (getOwnPropertyDescriptor(value, key).enumerable) arrayPush(keys, key);
  }
  for (const key of getOwnPropertySymbols(value)) {
    const descriptor = getOwnPropertyDescriptor(value, key);
    if (descriptor.enumerable) arrayPush(keys, key);
  }
  return keys;
}

function formatProperty(value, key, context, depth, asItem) {
  const descriptor = getOwnPropertyDescriptor(value, key);
  let shown;
  if (descriptor.get !== undefined || descriptor.set !== undefined) {
    const which =
      descriptor.get !== undefined && descriptor.set !== undefined
        ? "Getter/Setter"
        : descriptor.get !== undefined
          ? "Getter"
          : "Setter";
    shown = `[${which}]`;
  } else {
    context.indentation += 2;
    shown = formatValue(descriptor.value, context, depth + 1);
    context.indentation -= 2;
  }
  return asItem ? shown : `${formatKey(key)}: ${shown}`;
}

// The columns a terminal gives a character, as Deno counts them for a table's cells and
// an array's columns: two for the wide ones (East Asian scripts, most emoji), none for
// controls, combining marks and variation selectors, one for the rest.
// Each a flat list of ranges, first and last code point in turn, ascending.
const WIDE = [
  0x1100, 0x115f, 0x2329, 0x232a, 0x2e80, 0x303e, 0x3040, 0x3247, 0x3250, 0x4dbf,
  0x4e00, 0xa4c6, 0xa960, 0xa97c, 0xac00, 0xd7a3, 0xf900, 0xfaff, 0xfe10, 0xfe19,
  0xfe30, 0xfe6b, 0xff01, 0xff60, 0xffe0, 0xffe6, 0x1b000, 0x1b001,
  0x1f200, 0x1f251, 0x1f300, 0x1f64f, 0x20000, 0x3fffd,
];
const ZERO_WIDTH = [
  0x00, 0x1f, 0x7f, 0x9f, 0x300, 0x36f, 0x200b, 0x200f, 0x20d0, 0x20ff,
  0xfe00, 0xfe0f, 0xfe20, 0xfe2f, 0xe0100, 0xe01ef,
];
const stringCodePointAt = uncurry(String.prototype.codePointAt);

// (indexed, not iterated: a program may have replaced the arrays' iterator)
function within(ranges, code) {
  for (let i = 0; i < ranges.length; i += 2) {
    if (code < ranges[i]) return false;
    if (code <= ranges[i + 1]) return true;
  }
  return false;
}

function displayWidth(text) {
  let width = 0;
  for (let i = 0; i < text.length; i++) {
    const code = stringCodePointAt(text, i);
    if (code > 0xffff) i++;
    if (code < 0x300 && code >= 0x20 && (code < 0x7f || code > 0x9f)) width++;
    else if (within(WIDE, code)) width += 2;
    else if (!within(ZERO_WIDTH, code)) width++;
  }
  return width;
}

// Pads `text`, `shown` columns wide, to `width` columns.
function padTo(text, width, atStart, shown = displayWidth(text)) {
  const room = width + text.length - shown;
  return atStart ? stringPadStart(text, room, " ") : stringPadEnd(text, room, " ");
}

// Arrays of more than six items, each short, laid out in columns as Deno does.
function inColumns(output, value, context) {
  let total = 0;
  let longest = 0;
  const count = output.length - (output.length > ITEMS ? 1 : 0);
  const lengths = [];
  for (let i = 0; i < count; i++) {
    const length = displayWidth(output[i]);
    arrayPush(lengths, length);
    total += length + 2;
    longest = mathMax(longest, length);
  }
  const widest = longest + 2;
  if (widest * 3 + context.indentation >= LINE || (total / widest <= 5 && longest > 6)) {
    return output;
  }
  const bias = mathSqrt(widest - total / output.length);
  const square = mathMax(widest - 3 - bias, 1);
  const columns = mathMin(
    mathRound(mathSqrt(2.5 * square * count) / square),
    mathFloor((LINE - context.indentation) / widest),
    COMPACT * 4,
    15,
  );
  if (columns <= 1) return output;
  const widths = [];
  for (let column = 0; column < columns; column++) {
    let width = 0;
    for (let i = column; i < count; i += columns) width = mathMax(width, lengths[i]);
    arrayPush(widths, width + 2);
  }
  let numeric = value !== undefined;
  for (let i = 0; numeric && i < output.length; i++) {
    const item = value[i];
    if (typeof item !== "number" && typeof item !== "bigint") numeric = false;
  }
  const rows = [];
  for (let start = 0; start < count; start += columns) {
    const end = mathMin(start + columns, count);
    let row = "";
    for (let i = start; i < end - 1; i++) {
      row += padTo(`${output[i]}, `, widths[i - start], numeric, lengths[i] + 2);
    }
    const last = end - 1;
    const lastWidth = widths[last - start] - 2;
    row += numeric ? padTo(output[last], lastWidth, true, lengths[last]) : output[last];
    arrayPush(rows, row);
  }
  if (count < output.length) arrayPush(rows, output[count]);
  return rows;
}

// Entries in braces: on one line if the value's innermost levels fit there, else one
// entry a line (or a row of columns), indented.
function enclose(output, open, close, context, depth, grouped, base) {
  const start = output.length + context.indentation + open.length - (base ? 1 : 0) + 10;
  if (!grouped && context.deepest - depth < COMPACT && !stringIncludes(base, "\n")) {
    let total = start + output.length;
    let multiline = false;
    for (const entry of output) {
      total += entry.length;
      if (stringIncludes(entry, "\n")) multiline = true;
    }
    if (total <= LINE && !multiline) return `${open} ${arrayJoin(output, ", ")} ${close}`;
  }
  const indentation = `\n${stringRepeat(" ", context.indentation)}`;
  return `${open}${indentation}  ${arrayJoin(output, `,${indentation}  `)}${indentation}${close}`;
}

// A string inside a value, as Deno shows it: one longer than 16 characters and than
// what is left of the line is shown line by line, each quoted, joined by ` +`.
function formatString(text, context) {
  if (text.length <= 16 || text.length <= LINE - context.indentation - 4) return quote(text);
  const joint = ` +\n${stringRepeat(" ", context.indentation + 2)}`;
  let shown = "";
  for (let start = 0; start < text.length; ) {
    const newline = stringIndexOf(text, "\n", start);
    const end = newline === -1 ? text.length : newline + 1;
    shown += `${start === 0 ? "" : joint}${quote(stringSlice(text, start, end))}`;
    start = end;
  }
  return shown;
}

function formatValue(value, context, depth) {
  if (typeof value === "string") return formatString(value, context);
  if (value === null || (typeof value !== "object" && typeof value !== "function")) {
    return formatPrimitive(value, true);
  }
  const cycle = arrayIndexOf(context.seen, value);
  if (cycle !== -1) {
    let ref = context.refs.get(value);
    if (ref === undefined) {
      ref = context.refs.size + 1;
      context.refs.set(value, ref);
    }
    return `[Circular *${ref}]`;
  }
  const shown = formatObject(value, context, depth);
  const ref = context.refs.get(value);
  return ref === undefined ? shown : `<ref *${ref}> ${shown}`;
}

function tagOf(value) {
  return stringSlice(objectToString(value), 8, -1);
}

// The built-in a tag names, checked against what the value holds (a method of that
// built-in throws on anything else): `Symbol.toStringTag` is the program's to set.
const BRANDS = {
  Map: mapSize,
  Set: setSize,
  Date: dateGetTime,
  RegExp: regexpSource,
  ArrayBuffer: byteLength,
  Number: numberValueOf,
  String: stringValueOf,
  Boolean: booleanValueOf,
  BigInt: bigintValueOf,
  Symbol: symbolValueOf,
  WeakMap: weakMapHas,
  WeakSet: weakSetHas,
  WeakRef: weakRefDeref,
  URLSearchParams: searchParamsEntries,
  Headers: headersEntries,
};

function brandOf(value, tag) {
  if (tag === "Promise") return value instanceof PromiseCtor ? tag : null;
  if (!hasOwn(BRANDS, tag)) return null;
  try {
    BRANDS[tag](value);
    return tag;
  } catch {
    return null;
  }
}

function formatObject(value, context, depth) {
  const tag = tagOf(value);
  const name = className(value);
  // StarlingMonkey's URLSearchParams and Headers have no tag of their own.
  const named = tag === "Object" && (name === "URLSearchParams" || name === "Headers");
  const brand =
    typeof value === "function" || isArray(value) ? null : brandOf(value, named ? name : tag);
  let prefix = "";
  let open = "{";
  let close = "}";
  let output = [];
  let keys;
  let grouped = false;
  let base = "";
  if (typeof value === "function") {
    base = formatFunction(value);
    keys = ownKeys(value);
    if (keys.length === 0) return base;
    if (depth > context.depth) return functionKind(value) === "class" ? base : "[Function]";
  } else if (isArray(value)) {
    if (name !== "Array") prefix = `${name ?? "[Array: null prototype]"}(${value.length}) `;
    open = `${prefix}[`;
    close = "]";
    if (value.length === 0 && getOwnPropertyNames(value).length === 1) return `${open}]`;
    if (depth > context.depth) return `[${name ?? "Array"}]`;
    enter(value, context, depth);
    ({ output, keys } = arrayParts(value, value.length, context, depth));
  } else if (brand === "Map" || brand === "Set") {
    const isMap = brand === "Map";
    const size = isMap ? mapSize(value) : setSize(value);
    const made = name === null || name === brand ? brand : `${name}(${size}) [${brand}]`;
    open = made === brand ? `${brand}(${size}) {` : `${made} {`;
    keys = ownKeys(value);
    if (size === 0 && keys.length === 0) return `${open}}`;
    if (depth > context.depth) return `[${name ?? tag}]`;
    enter(value, context, depth);
    const iterator = isMap ? mapEntries(value) : setValues(value);
    const next = isMap ? mapIteratorNext : setIteratorNext;
    context.indentation += 2;
    for (let step = next(iterator); !step.done; step = next(iterator)) {
      if (output.length === ITEMS) {
        arrayPush(output, moreItems(size - ITEMS));
        break;
      }
      const entry = step.value;
      arrayPush(
        output,
        isMap
          ? `${formatValue(entry[0], context, depth + 1)} => ${formatValue(entry[1], context, depth + 1)}`
          : formatValue(entry, context, depth + 1),
      );
    }
    context.indentation -= 2;
  } else if (isView(value) && !(value instanceof DataViewCtor)) {
    const length = typedArrayLength(value);
    open = `${typedArrayTag(value)}(${length}) [`;
    close = "]";
    keys = [];
    if (length === 0) return `${open}]`;
    if (depth > context.depth) return `[${typedArrayTag(value)}]`;
    enter(value, context, depth);
    for (let i = 0; i < length && i < ITEMS; i++) arrayPush(output, formatPrimitive(value[i], true));
    if (length > ITEMS) arrayPush(output, moreItems(length - ITEMS));
  } else {
    keys = ownKeys(value);
    if (brand === "Date") {
      base = isNaN(dateGetTime(value)) ? "Invalid Date" : dateToISOString(value);
    } else if (brand === "RegExp") {
      base = regexpToString(value);
    } else if (value instanceof ErrorCtor) {
      base = formatError(value, context, true);
      keys = without(keys, ["stack", "message", "name", ...ERROR_FIELDS]);
    } else if (
      brand === "Number" ||
      brand === "String" ||
      brand === "Boolean" ||
      brand === "BigInt" ||
      brand === "Symbol"
    ) {
      base = `[${brand}: ${boxed(value, brand)}]`;
      if (brand === "String") keys = onlyNames(keys);
    } else if (brand === "WeakMap" || brand === "WeakSet" || brand === "WeakRef") {
      return `${brand} { <items unknown> }`;
    } else if (brand === "Promise") {
      return "Promise { <unknown> }";
    } else if (brand === "ArrayBuffer") {
      return formatArrayBuffer(value);
    } else if (brand === "URLSearchParams" || brand === "Headers") {
      if (depth > context.depth) return `[${brand}]`;
      const entries = namedEntries(value, brand);
      if (entries.length === 0) return `${brand} {}`;
      context.deepest = mathMax(context.deepest, depth + 1);
      return enclose(entries, `${brand} {`, "}", context, depth, false, "");
    } else if (value instanceof URLCtor && keys.length === 0 && brand === null) {
      return formatURL(value, context, depth);
    } else if (name === null) {
      prefix = "[Object: null prototype]";
    } else if (name !== "Object") {
      const plain = hasOwn(value, Symbol.toStringTag) || tag === "Object" || tag === name;
      prefix = plain ? name : `${name} [${tag}]`;
    } else if (tag !== "Object") {
      prefix = `Object [${tag}]`;
    }
    const fielded = value instanceof ErrorCtor && hasErrorFields(value);
    if (base !== "" && keys.length === 0 && !fielded) return base;
    if (keys.length === 0 && !fielded) return prefix ? `${prefix} {}` : "{}";
    if (depth > context.depth) return name === null ? "[Object: null prototype]" : `[${name}]`;
    open = prefix ? `${prefix} {` : "{";
    enter(value, context, depth);
  }
  if (base !== "") {
    if (depth > context.depth) return base;
    enter(value, context, depth);
  }
  for (const key of keys) arrayPush(output, formatProperty(value, key, context, depth, false));
  if (value instanceof ErrorCtor) {
    // Given to the constructor, a cause and an AggregateError's errors are not
    // enumerable, and shown as Deno shows them.
    for (const field of ERROR_FIELDS) {
      const own = getOwnPropertyDescriptor(value, field);
      if (own === undefined || !hasOwn(own, "value")) continue;
      const shown = own.enumerable ? field : `[${field}]`;
      context.indentation += 2;
      arrayPush(output, `${shown}: ${formatValue(own.value, context, depth + 1)}`);
      context.indentation -= 2;
    }
  }
  context.seen.pop();
  if (output.length > 6 && (isArray(value) || (isView(value) && open !== "{"))) {
    const columns = inColumns(output, value, context);
    grouped = columns !== output;
    output = columns;
  }
  const opening = base !== "" ? `${base} {` : open;
  return enclose(output, opening, close, context, depth, grouped, base);
}

function formatArrayBuffer(value) {
  const bytes = new Uint8ArrayCtor(value);
  const length = byteLength(value);
  let hex = "";
  for (let i = 0; i < length && i < 50; i++) {
    hex += `${i === 0 ? "" : " "}${stringPadStart(bytes[i].toString(16), 2, "0")}`;
  }
  if (length > 50) hex += ` ... ${length - 50} more byte${length - 50 === 1 ? "" : "s"}`;
  return `ArrayBuffer { [Uint8Contents]: <${hex}>, byteLength: ${length} }`;
}

// A URLSearchParams's pairs as Deno shows them, as a Map's; a Headers's as fields.
function namedEntries(value, brand) {
  const output = [];
  for (const [name, text] of BRANDS[brand](value)) {
    const shown = brand === "Headers" ? `${formatKey(name)}: ` : `${quote(name)} => `;
    arrayPush(output, `${shown}${quote(text)}`);
  }
  return output;
}

// A URL as Deno shows one: its parts, as if they were its own fields.
function formatURL(value, context, depth) {
  if (depth > context.depth) return "[URL]";
  const output = [];
  for (const field of [...URL_FIELDS, ...URL_LAST_FIELDS]) {
    arrayPush(output, `${field}: ${quote(value[field])}`);
  }
  enter(value, context, depth);
  context.seen.pop();
  return enclose(output, "URL {", "}", context, depth, false, "");
}

function without(keys, dropped) {
  const kept = [];
  for (const key of keys) if (!arrayIncludes(dropped, key)) arrayPush(kept, key);
  return kept;
}

// A String object's keys but its characters' indices.
function onlyNames(keys) {
  const kept = [];
  for (const key of keys) if (typeof key === "symbol" || !isIndex(key)) arrayPush(kept, key);
  return kept;
}

function enter(value, context, depth) {
  arrayPush(context.seen, value);
  context.deepest = depth;
}

function boxed(value, tag) {
  switch (tag) {
    case "Number":
      return formatNumber(numberValueOf(value));
    case "String":
      return quote(stringValueOf(value));
    case "Boolean":
      return toText(booleanValueOf(value));
    case "BigInt":
      return `${bigintValueOf(value)}n`;
    default:
      return symbolToString(symbolValueOf(value));
  }
}

/** A value as Deno's `console.log` shows it, nested (strings quoted). */
export function inspect(value, indentation = 0, depth = DEPTH) {
  const context = { seen: [], refs: new MapCtor(), indentation, deepest: 0, depth };
  return formatValue(value, context, 0);
}

// How deep `console.dir`'s options say to show a value: `depth`, any number, or
// `null` for all the way down, as Deno reads it.
function depthOf(options) {
  const depth = options?.depth;
  if (depth === null) return Infinity;
  return typeof depth === "number" && !isNaN(depth) ? depth : DEPTH;
}

function formatArgument(value, indentation) {
  return typeof value === "string" ? value : inspect(value, indentation);
}

// `%s` and its kin in a first argument that is a string, as Deno reads them.
function formatSpecifiers(format, args) {
  let text = "";
  let next = 1;
  let from = 0;
  for (let i = 0; i < format.length - 1; i++) {
    if (format[i] !== "%") continue;
    const specifier = format[i + 1];
    let replacement;
    if (specifier === "%") {
      replacement = "%";
    } else if (next < args.length && arrayIncludes(["s", "d", "i", "f", "o", "O", "j", "c"], specifier)) {
      const arg = args[next++];
      replacement = specify(specifier, arg);
    } else {
      continue;
    }
    text += stringSlice(format, from, i) + replacement;
    from = i + 2;
    i++;
  }
  text += stringSlice(format, from);
  return { text, next };
}

function specify(specifier, arg) {
  switch (specifier) {
    case "s":
      return typeof arg === "symbol" ? symbolToString(arg) : toText(arg);
    case "d":
    case "i":
      if (typeof arg === "bigint") return `${arg}`;
      return typeof arg === "symbol" ? "NaN" : formatNumber(parseIntText(arg));
    case "f":
      return typeof arg === "symbol" ? "NaN" : formatNumber(parseFloatText(arg));
    case "j":
      return stringify(arg);
    case "c":
      return "";
    default:
      return inspect(arg);
  }
}

/** The text of one `console.log(...args)` line, as Deno makes it. */
export function formatLine(args, indentation = 0) {
  if (args.length === 0) return "";
  let text;
  let next;
  if (typeof args[0] === "string" && args.length > 1) {
    ({ text, next } = formatSpecifiers(args[0], args));
  } else {
    text = formatArgument(args[0], indentation);
    next = 1;
  }
  for (let i = next; i < args.length; i++) text += ` ${formatArgument(args[i], indentation)}`;
  return text;
}

// The program's frames where `console.trace` was called, as `formatError` shows them.
function frames() {
  const shown = formatError(new Error(""), { indentation: 0 });
  return stringSlice(shown, stringStartsWith(shown, "Error") ? 5 : 0);
}

/** Replaces `target`'s methods (the engine's console) with Deno's, writing each line
 * through `out` (stdout) or `err` (stderr). */
export function installConsole(target, out, err) {
  let indent = "";
  const counts = new MapCtor();
  const timers = new MapCtor();
  const clock = performance;
  const now = uncurry(clock.now);
  const write = (stream, text) => {
    const lines = indent === "" ? text : `${indent}${stringReplace(text, /\n/g, `\n${indent}`)}`;
    // The engine writes a line as a C string: a NUL would end it, and the rest of the
    // line would be lost. It goes out as U+FFFD (Deno writes the NUL itself).
    stream(stringIncludes(lines, "\0") ? stringReplace(lines, /\0/g, "\uFFFD") : lines);
  };
  const label = (value) => (value === undefined ? "default" : `${value}`);
  const methods = {
    log: (...args) => write(out, formatLine(args)),
    info: (...args) => write(out, formatLine(args)),
    debug: (...args) => write(out, formatLine(args)),
    dirxml: (...args) => write(out, formatLine(args)),
    error: (...args) => write(err, formatLine(args)),
    warn: (...args) => write(err, formatLine(args)),
    dir: (value, options) =>
      write(out, typeof value === "string" ? value : inspect(value, 0, depthOf(options))),
    trace: (...args) => {
      const text = args.length === 0 ? "Trace" : `Trace: ${formatLine(args)}`;
      write(err, `${text}${frames()}`);
    },
    assert: (condition, ...args) => {
      if (condition) return;
      write(err, args.length === 0 ? "Assertion failed" : `Assertion failed: ${formatLine(args)}`);
    },
    group: (...args) => {
      if (args.length > 0) write(out, formatLine(args));
      indent += "  ";
    },
    groupCollapsed: (...args) => methods.group(...args),
    groupEnd: () => {
      indent = stringSlice(indent, 2);
    },
    count: (name) => {
      const key = label(name);
      const count = (counts.get(key) ?? 0) + 1;
      counts.set(key, count);
      out(`${key}: ${count}`); // not indented by a group, as on Deno
    },
    countReset: (name) => {
      counts.delete(label(name));
    },
    time: (name) => {
      timers.set(label(name), now(clock));
    },
    timeLog: (name, ...args) => {
      const key = label(name);
      if (!timers.has(key)) return;
      const rest = args.length === 0 ? "" : ` ${formatLine(args)}`;
      write(out, `${key}: ${elapsed(now(clock) - timers.get(key))}${rest}`);
    },
    timeEnd: (name) => {
      const key = label(name);
      if (!timers.has(key)) return;
      write(out, `${key}: ${elapsed(now(clock) - timers.get(key))}`);
      timers.delete(key);
    },
    table: (data, properties) => {
      const table = formatTable(data, properties);
      write(out, table === null ? formatLine([data]) : table);
    },
    clear: () => {},
  };
  for (const name of getOwnPropertyNames(methods)) {
    const method = methods[name];
    Object.defineProperty(target, name, {
      value: method,
      writable: true,
      enumerable: true,
      configurable: true,
    });
  }
}

function elapsed(ms) {
  return `${mathRound(ms * 1000) / 1000}ms`;
}

// `console.table` as Deno draws it: a column for the index, one per key the rows have
// (or `properties`), and "Values" for rows that are not objects; whole numbers aligned
// right where a column holds nothing else. None for what is not an object (logged).
// A table cell's text, and whether it is a whole number (which aligns right).
function cell(value) {
  const text = inspect(value);
  return [text, typeof value === "number" && regexpTest(/^[0-9]+$/, text)];
}

function formatTable(data, properties) {
  if (data === null || typeof data !== "object") return null;
  const tag = brandOf(data, tagOf(data));
  const brand = tag === "Map" || tag === "Set" ? tag : null;
  const rows = [];
  if (brand !== null) {
    const iterator = brand === "Map" ? mapEntries(data) : setValues(data);
    const next = brand === "Map" ? mapIteratorNext : setIteratorNext;
    let index = 0;
    for (let step = next(iterator); !step.done; step = next(iterator)) {
      const row = brand === "Map" ? { key: step.value[0], value: step.value[1] } : { value: step.value };
      arrayPush(rows, { index: index++, ...row });
    }
  } else {
    for (const key of getOwnPropertyNames(data)) {
      if (isArray(data) && key === "length") continue;
      if (!getOwnPropertyDescriptor(data, key).enumerable) continue;
      arrayPush(rows, { index: isArray(data) ? toNumber(key) : key, value: data[key] });
    }
  }
  const columns = [];
  let values = false;
  for (const row of rows) {
    const value = row.value;
    if (brand === null && value !== null && typeof value === "object") {
      for (const key of getOwnPropertyNames(value)) {
        if (isArray(value) && key === "length") continue;
        if (!arrayIncludes(columns, key)) arrayPush(columns, key);
      }
    } else {
      values = true;
    }
  }
  const shownColumns = isArray(properties) ? properties : columns;
  const header = [brand === null ? "(idx)" : "(iter idx)"];
  if (brand === "Map") arrayPush(header, "Key");
  for (const key of shownColumns) arrayPush(header, toText(key));
  if (values || brand !== null) arrayPush(header, "Values");
  const cells = [];
  const numeric = [];
  for (const row of rows) {
    const line = [typeof row.index === "string" ? [row.index, false] : cell(row.index)];
    if (brand === "Map") arrayPush(line, cell(row.key));
    const value = row.value;
    // A Map's or Set's values are shown whole, an array's or object's rows by key.
    const isObject = brand === null && value !== null && typeof value === "object";
    for (const key of shownColumns) {
      const present = isObject && hasOwn(value, key);
      arrayPush(line, present ? cell(value[key]) : ["", null]);
    }
    if (values || brand !== null) arrayPush(line, isObject ? ["", null] : cell(value));
    arrayPush(cells, line);
  }
  const widths = [];
  for (let column = 0; column < header.length; column++) {
    let width = displayWidth(header[column]);
    let right = false;
    let anyNumber = false;
    let allNumbers = true;
    for (const line of cells) {
      const [text, isNumber] = line[column];
      width = mathMax(width, displayWidth(text));
      if (isNumber === null) continue;
      if (isNumber) anyNumber = true;
      else allNumbers = false;
    }
    right = anyNumber && allNumbers;
    arrayPush(widths, width);
    arrayPush(numeric, right);
  }
  const rule = (left, middle, end) => {
    let text = left;
    for (let i = 0; i < widths.length; i++) {
      text += `${stringRepeat("─", widths[i] + 2)}${i === widths.length - 1 ? end : middle}`;
    }
    return text;
  };
  const render = (texts, aligned) => {
    let text = "│";
    for (let i = 0; i < texts.length; i++) {
      const cell = texts[i];
      text += ` ${padTo(cell, widths[i], aligned[i])} │`;
    }
    return text;
  };
  const lines = [rule("┌", "┬", "┐"), render(header, [])];
  arrayPush(lines, rule("├", "┼", "┤"));
  for (const line of cells) {
    const texts = [];
    for (const [text] of line) arrayPush(texts, text);
    arrayPush(lines, render(texts, numeric));
  }
  arrayPush(lines, rule("└", "┴", "┘"));
  return arrayJoin(lines, "\n");
}
