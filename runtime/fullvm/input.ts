/**
 * The computer-use action set as QEMU input events: what a harness asks for (`left_click` at
 * [x, y], `key` "ctrl+l", `type` "echo hi\n") becomes absolute tablet moves, button and key
 * presses by QEMU key code, and pauses between them. Pure: the backend sends the events (QMP
 * `input-send-event`), so the screen and input go through the VMM, never through a process in the
 * guest that the agent could kill.
 */
import { type ComputerAction, Limits, ProtocolError } from '../../protocol/index.ts';

/** One QMP InputEvent. */
export type QmpInput = { type: 'key'; data: { down: boolean; key: { type: 'qcode'; data: string } } } | { type: 'btn'; data: { down: boolean; button: string } } | { type: 'abs'; data: { axis: 'x' | 'y'; value: number } };

/** What the backend does in order: send events (one QMP command), or wait. */
export type Step = { events: QmpInput[] } | { sleepMs: number };

export interface Pointer {
  x: number;
  y: number;
}

/** The absolute axes' range of QEMU's tablet (INPUT_EVENT_ABS_MAX + 1). */
const ABS = 0x8000;
/** Between the clicks of a double or triple click: well inside any toolkit's double-click time. */
const MULTI_CLICK_GAP_MS = 40;

const LETTERS = 'abcdefghijklmnopqrstuvwxyz';
const DIGITS = '1234567890';
const SHIFTED_DIGITS = '!@#$%^&*()';
/** US layout: character → [qcode, shifted]. */
const PUNCT: Record<string, [string, boolean]> = {
  ' ': ['spc', false],
  '\n': ['ret', false],
  '\t': ['tab', false],
  '-': ['minus', false],
  _: ['minus', true],
  '=': ['equal', false],
  '+': ['equal', true],
  '[': ['bracket_left', false],
  '{': ['bracket_left', true],
  ']': ['bracket_right', false],
  '}': ['bracket_right', true],
  ';': ['semicolon', false],
  ':': ['semicolon', true],
  "'": ['apostrophe', false],
  '"': ['apostrophe', true],
  '`': ['grave_accent', false],
  '~': ['grave_accent', true],
  '\\': ['backslash', false],
  '|': ['backslash', true],
  ',': ['comma', false],
  '<': ['comma', true],
  '.': ['dot', false],
  '>': ['dot', true],
  '/': ['slash', false],
  '?': ['slash', true],
};

function charKey(c: string): [string, boolean] | undefined {
  if (LETTERS.includes(c)) return [c, false];
  if (LETTERS.toUpperCase().includes(c)) return [c.toLowerCase(), true];
  const d = DIGITS.indexOf(c);
  if (d >= 0) return [c, false];
  const s = SHIFTED_DIGITS.indexOf(c);
  if (s >= 0) return [DIGITS[s]!, true];
  return PUNCT[c];
}

/** Key names as xdotool and computer-use harnesses send them (case-insensitive) → QEMU qcodes. */
const NAMED: Record<string, string> = {
  ctrl: 'ctrl', control: 'ctrl', control_l: 'ctrl', ctrl_l: 'ctrl', control_r: 'ctrl_r', ctrl_r: 'ctrl_r',
  shift: 'shift', shift_l: 'shift', shift_r: 'shift_r',
  alt: 'alt', alt_l: 'alt', alt_r: 'alt_r', altgr: 'alt_r', meta: 'meta_l',
  super: 'meta_l', super_l: 'meta_l', super_r: 'meta_r', win: 'meta_l', cmd: 'meta_l', command: 'meta_l',
  return: 'ret', enter: 'ret', kp_enter: 'kp_enter', escape: 'esc', esc: 'esc', tab: 'tab', iso_left_tab: 'tab',
  backspace: 'backspace', delete: 'delete', del: 'delete', insert: 'insert', space: 'spc',
  home: 'home', end: 'end', page_up: 'pgup', pageup: 'pgup', prior: 'pgup', page_down: 'pgdn', pagedown: 'pgdn', next: 'pgdn',
  up: 'up', down: 'down', left: 'left', right: 'right',
  caps_lock: 'caps_lock', num_lock: 'num_lock', scroll_lock: 'scroll_lock', print: 'print', pause: 'pause', menu: 'menu',
  minus: 'minus', equal: 'equal', plus: 'equal', comma: 'comma', period: 'dot', slash: 'slash', backslash: 'backslash',
  semicolon: 'semicolon', apostrophe: 'apostrophe', grave: 'grave_accent', bracketleft: 'bracket_left', bracketright: 'bracket_right',
};
for (let i = 1; i <= 12; i++) NAMED[`f${i}`] = `f${i}`;
for (let i = 0; i <= 9; i++) NAMED[`kp_${i}`] = `kp_${i}`;

/** A key name → qcode (and whether it needs shift, for a single character such as `A` or `?`). */
function keyCode(name: string): [string, boolean] {
  const n = NAMED[name.toLowerCase()];
  if (n) return [n, false];
  if (name.length === 1) {
    const c = charKey(name);
    if (c) return c;
  }
  throw new ProtocolError('INVALID_REQUEST', `unknown key '${name}' (xdotool names: ctrl, shift, alt, super, Return, Escape, Tab, BackSpace, Delete, Up, Page_Down, F1…F12, a single character)`, { detail: { field: 'text', key: name } });
}

/** `ctrl+shift+t` → its qcodes, modifiers first. */
export function chord(text: string): string[] {
  const parts = text.split('+').map((p) => p.trim());
  // `ctrl++` means ctrl and plus.
  if (text.endsWith('++')) parts.splice(parts.length - 2, 2, '+');
  if (parts.some((p) => p === '')) throw new ProtocolError('INVALID_REQUEST', `bad key combination '${text}'`, { detail: { field: 'text' } });
  if (parts.length > Limits.display.keysMax) throw new ProtocolError('INVALID_REQUEST', `key: at most ${Limits.display.keysMax} keys at once`, { detail: { field: 'text' } });
  const codes: string[] = [];
  for (const p of parts) {
    const [q, shifted] = keyCode(p);
    if (shifted && !codes.includes('shift')) codes.push('shift');
    codes.push(q);
  }
  return codes;
}

const key = (q: string, down: boolean): QmpInput => ({ type: 'key', data: { down, key: { type: 'qcode', data: q } } });
const btn = (button: string, down: boolean): QmpInput => ({ type: 'btn', data: { down, button } });

function press(codes: string[]): QmpInput[] {
  return [...codes.map((q) => key(q, true)), ...[...codes].reverse().map((q) => key(q, false))];
}

/** The keys of `text`, one step per character. Throws for a character a US keyboard cannot type. */
function typing(text: string): Step[] {
  const steps: Step[] = [];
  let i = 0;
  for (const c of text) {
    const k = charKey(c === '\r' ? '\n' : c);
    if (!k) throw new ProtocolError('INVALID_REQUEST', `type: character ${JSON.stringify(c)} (at ${i}) has no key on a US keyboard`, { detail: { field: 'text', at: i } });
    steps.push({ events: press(k[1] ? ['shift', k[0]] : [k[0]]) });
    i++;
  }
  return steps;
}

function need<T>(v: T | undefined, field: string, action: string): T {
  if (v === undefined) throw new ProtocolError('INVALID_REQUEST', `${action}: ${field} is required`, { detail: { field } });
  return v;
}

/** Moves the pointer to [x, y]: absolute axes scaled to the screen. */
export function moveTo(p: Pointer, screen: { width: number; height: number }): QmpInput[] {
  const scale = (v: number, n: number) => Math.round((v * (ABS - 1)) / Math.max(1, n - 1));
  return [
    { type: 'abs', data: { axis: 'x', value: scale(p.x, screen.width) } },
    { type: 'abs', data: { axis: 'y', value: scale(p.y, screen.height) } },
  ];
}

function onScreen(c: [number, number], screen: { width: number; height: number }, field: string): Pointer {
  const [x, y] = c;
  if (x >= screen.width || y >= screen.height) {
    throw new ProtocolError('INVALID_REQUEST', `${field} [${x}, ${y}] is off the screen (${screen.width}×${screen.height}: x < ${screen.width}, y < ${screen.height})`, { detail: { field, width: screen.width, height: screen.height } });
  }
  return { x, y };
}

/**
 * The steps of one action, and where the pointer is afterwards. Everything is checked before
 * anything is sent: a bad action sends nothing.
 */
export function plan(a: ComputerAction, pointer: Pointer, screen: { width: number; height: number }): { steps: Step[]; pointer: Pointer } {
  const at = a.coordinate ? onScreen(a.coordinate, screen, 'coordinate') : undefined;
  const steps: Step[] = [];
  let p = pointer;
  const go = (to: Pointer | undefined) => {
    if (!to) return;
    steps.push({ events: moveTo(to, screen) });
    p = to;
  };
  const mods = (text: string | undefined) => (text ? chord(text) : []);
  const click = (button: string, times: number) => {
    const held = mods(a.text);
    go(at);
    if (held.length) steps.push({ events: held.map((q) => key(q, true)) });
    for (let i = 0; i < times; i++) {
      if (i) steps.push({ sleepMs: MULTI_CLICK_GAP_MS });
      steps.push({ events: [btn(button, true)] }, { events: [btn(button, false)] });
    }
    if (held.length) steps.push({ events: [...held].reverse().map((q) => key(q, false)) });
  };
  switch (a.action) {
    case 'screenshot':
    case 'cursor_position':
      break;
    case 'mouse_move':
      go(need(at, 'coordinate', a.action));
      break;
    case 'left_click':
      click('left', 1);
      break;
    case 'right_click':
      click('right', 1);
      break;
    case 'middle_click':
      click('middle', 1);
      break;
    case 'double_click':
      click('left', 2);
      break;
    case 'triple_click':
      click('left', 3);
      break;
    case 'left_mouse_down':
      go(at);
      steps.push({ events: [btn('left', true)] });
      break;
    case 'left_mouse_up':
      go(at);
      steps.push({ events: [btn('left', false)] });
      break;
    case 'left_click_drag': {
      const to = need(at, 'coordinate', a.action);
      go(a.start_coordinate ? onScreen(a.start_coordinate, screen, 'start_coordinate') : undefined);
      steps.push({ events: [btn('left', true)] });
      // Through the middle, so a toolkit sees motion with the button held, not a jump.
      const from = p;
      go({ x: Math.round((from.x + to.x) / 2), y: Math.round((from.y + to.y) / 2) });
      go(to);
      steps.push({ events: [btn('left', false)] });
      break;
    }
    case 'scroll': {
      const dir = a.scroll_direction ?? 'down';
      const n = a.scroll_amount ?? 3;
      const held = mods(a.text);
      go(at);
      if (held.length) steps.push({ events: held.map((q) => key(q, true)) });
      for (let i = 0; i < n; i++) steps.push({ events: [btn(`wheel-${dir}`, true)] }, { events: [btn(`wheel-${dir}`, false)] });
      if (held.length) steps.push({ events: [...held].reverse().map((q) => key(q, false)) });
      break;
    }
    case 'type':
      steps.push(...typing(need(a.text, 'text', a.action)));
      break;
    case 'key':
      steps.push({ events: press(chord(need(a.text, 'text', a.action))) });
      break;
    case 'hold_key': {
      const codes = chord(need(a.text, 'text', a.action));
      steps.push({ events: codes.map((q) => key(q, true)) }, { sleepMs: Math.round(need(a.duration, 'duration', a.action) * 1000) }, { events: [...codes].reverse().map((q) => key(q, false)) });
      break;
    }
    case 'wait':
      steps.push({ sleepMs: Math.round((a.duration ?? 1) * 1000) });
      break;
  }
  return { steps, pointer: p };
}
