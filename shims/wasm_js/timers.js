// The program's timers on wasm-js: `setTimeout`, `setInterval` and their clears.
//
// Kept here rather than left to the engine, whose timers fire in the order they were
// made when several are due at once (after a busy stretch of the program): Deno's, as
// the web's, fire in the order they fall due, ties in the order they were made, one
// callback per turn of the event loop (its microtasks run in between). So the program's
// timers wait in a heap, and one engine timer at a time is set for the soonest; each
// firing runs the soonest due. The guest's wait for tool calls ends by `nextDueIn()`.
//
// What the program hands over is only called, never read from: a program that replaces
// Map, Array or Object methods changes nothing here (the heap is an object without a
// prototype, the id table's methods are captured).

const uncurry = (method) => Function.prototype.call.bind(method);
const mapGet = uncurry(Map.prototype.get);
const mapSet = uncurry(Map.prototype.set);
const mapDelete = uncurry(Map.prototype.delete);
const apply = Reflect.apply;
const create = Object.create;
const max = Math.max;
const NativeMap = Map;
const global = globalThis;
const NativeTypeError = TypeError;
const symbolText = uncurry(Symbol.prototype.toString);

// Cleared timers stay in the heap until they reach its top; past this many more of
// them than live ones, the heap is rebuilt without them.
const CLEARED_SLACK = 64;

// What Deno's refusal of a callback that is no function says it received.
function received(value) {
  if (value === null || value === undefined) return `${value}`;
  if (typeof value === "object") return `an instance of ${value.constructor?.name ?? "Object"}`;
  let shown = typeof value === "string" ? `'${value}'` : typeof value === "symbol"
    ? symbolText(value)
    : `${value}${typeof value === "bigint" ? "n" : ""}`;
  if (shown.length > 25) shown = `${shown.slice(0, 25)}...`;
  return `type ${typeof value} (${shown})`;
}

// `engine`: {setTimeout, clearTimeout} as the engine has them; `now()`: the clock
// timers are due by; `bound(delay)`: the wait a delay gets; `guarded(callback)`: the
// callback as run.
export function makeTimers({ engine, now, bound, guarded }) {
  const engineSet = engine.setTimeout;
  const engineClear = engine.clearTimeout;
  const byId = new NativeMap();
  const heap = { items: create(null), size: 0, cleared: 0 };
  const state = { ids: 0, made: 0, armed: null, armedFor: Infinity };

  function earlier(a, b) {
    return a.due < b.due || (a.due === b.due && a.order < b.order);
  }

  function push(entry) {
    const items = heap.items;
    let index = heap.size++;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (!earlier(entry, items[parent])) break;
      items[index] = items[parent];
      index = parent;
    }
    items[index] = entry;
  }

  function pop() {
    const items = heap.items;
    const top = items[0];
    const last = items[--heap.size];
    delete items[heap.size];
    if (heap.size > 0) {
      let index = 0;
      for (;;) {
        const left = 2 * index + 1;
        if (left >= heap.size) break;
        const right = left + 1;
        const child = right < heap.size && earlier(items[right], items[left]) ? right : left;
        if (!earlier(items[child], last)) break;
        items[index] = items[child];
        index = child;
      }
      items[index] = last;
    }
    return top;
  }

  // The soonest timer still set, or null; cleared ones on top are dropped.
  function soonest() {
    while (heap.size > 0 && heap.items[0].cleared) {
      pop();
      heap.cleared--;
    }
    return heap.size > 0 ? heap.items[0] : null;
  }

  function rebuild() {
    const { items, size } = heap;
    heap.items = create(null);
    heap.size = heap.cleared = 0;
    for (let index = 0; index < size; index++) {
      if (!items[index].cleared) push(items[index]);
    }
  }

  // One engine timer, set for the soonest of the program's.
  function arm() {
    const next = soonest();
    if (next === null || (state.armed !== null && state.armedFor <= next.due)) return;
    if (state.armed !== null) engineClear(state.armed);
    state.armedFor = next.due;
    state.armed = engineSet(fire, max(0, next.due - now()));
  }

  function fire() {
    state.armed = null;
    state.armedFor = Infinity;
    const entry = soonest();
    if (entry === null || entry.due > now()) {
      arm(); // woken early: wait on
      return;
    }
    pop();
    if (entry.period > 0) {
      entry.due = now() + entry.period;
      entry.order = state.made++;
      push(entry);
    } else {
      mapDelete(byId, entry.id);
    }
    arm(); // before the callback, which may throw
    apply(entry.run, global, entry.args);
  }

  function start(callback, delay, args, repeating) {
    if (typeof callback !== "function") {
      throw new NativeTypeError(
        `The "callback" argument must be of type function. Received ${received(callback)}`,
      );
    }
    const run = guarded(callback);
    const wait = bound(delay);
    const entry = {
      id: ++state.ids,
      due: now() + wait,
      order: state.made++,
      period: repeating ? wait : 0,
      run,
      args,
      cleared: false,
    };
    mapSet(byId, entry.id, entry);
    push(entry);
    arm();
    return entry.id;
  }

  function clear(id) {
    const entry = mapGet(byId, id);
    if (entry === undefined) return;
    mapDelete(byId, id);
    entry.cleared = true;
    if (++heap.cleared > heap.size - heap.cleared + CLEARED_SLACK) rebuild();
  }

  return {
    setTimeout(callback, delay, ...args) {
      return start(callback, delay, args, false);
    },
    setInterval(callback, delay, ...args) {
      return start(callback, delay, args, true);
    },
    clearTimeout(id) {
      clear(id);
    },
    clearInterval(id) {
      clear(id);
    },
    // Milliseconds until the soonest timer is due, or null if none is set.
    nextDueIn() {
      const next = soonest();
      return next === null ? null : max(0, next.due - now());
    },
  };
}
