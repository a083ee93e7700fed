import { useSearchParams } from "react-router-dom";

/** A page's filters, kept in its URL (`#/calls?tool=x`) so a link or a reload keeps them. */
export function useFilterParams() {
  const [params, setParams] = useSearchParams();
  const get = (name: string) => params.get(name) ?? "";
  const set = (name: string, value: string) =>
    setParams(
      (previous) => {
        const next = new URLSearchParams(previous);
        if (value) {
          next.set(name, value);
        } else {
          next.delete(name);
        }
        return next;
      },
      { replace: true },
    );
  return { get, set };
}
